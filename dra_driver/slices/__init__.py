"""ResourceSlices: the pure builder and the publisher (the only writer of ResourceSlices)."""
