"""How stages run: the stage runner, matrix instances, and the Ray sweep of a matrix stage's instances."""
