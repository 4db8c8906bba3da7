"""Studies outside the default pipeline: the research questions (their runs, statistics and tables) and the
length-bias summary."""
