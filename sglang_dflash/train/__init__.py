"""Drafter training recipe for the embedded SmolLM2 target: prompts -> datagen -> features -> train -> export."""
