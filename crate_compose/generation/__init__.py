"""Text from a causal network: cached decoding (:mod:`.decoding`) and ``crate-compose generate`` (:mod:`.text`)."""
