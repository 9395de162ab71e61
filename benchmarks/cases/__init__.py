"""One module per benchmark case; each has ``run(ctx) -> list[Row]``."""
