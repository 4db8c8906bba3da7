"""The coding-tools environment: generic tools (Read, Edit, Write, Bash) over an in-memory repository per
episode, its sandbox, its hidden-test grader, its scripted expert and its chat format."""
