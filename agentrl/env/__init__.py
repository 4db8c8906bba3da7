"""The gym: tasks, repair ops, tool-calling episodes, scripted callers, the tokenizer."""
