"""The text sets: the standard library's source (:mod:`.corpus`), the tokenizers (:mod:`.tokens`, :mod:`.byte_level`,
GPT-2's files in :mod:`.gpt2_vocabulary`), BERT's and next-token windows and text folders (:mod:`.texts`), and
Shakespeare's works (:mod:`.shakespeare`).
"""
