"""One module per algorithm, each with `build(ctx, size, offset=0, length=None) -> Schedule`."""
