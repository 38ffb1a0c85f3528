"""The image sets: scikit-learn's and the npm registry's (:mod:`.shipped`), your folders (:mod:`.folders`),
and the generated sets with masks (:mod:`.pasted`, :mod:`.shapes`, drawn on :mod:`.textures`, kept by :mod:`.generated`).
"""
