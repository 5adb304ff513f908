"""Running prefixcache on an existing distributed serving engine (Ray Serve: :mod:`.ray`)."""
