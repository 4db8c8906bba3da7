"""Generic coding tools (Read, Edit, Write, Bash) over an in-memory repository per episode, the environment built on them, its grader and scripted expert."""
