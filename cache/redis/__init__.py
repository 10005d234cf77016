"""The cache's Redis store: connection, the two layouts (Redis 8 vector sets, Redis 7 stream), their codec."""
