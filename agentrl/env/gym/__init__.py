"""The coding gym: its episodes, scripted callers and word-level tokenizer."""
