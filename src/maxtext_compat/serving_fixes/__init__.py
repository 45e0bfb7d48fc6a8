"""Fixes of the serving stack's request handling, each a patch profile chosen by the matrix: request defects of
tpu-inference refused or fixed (`request_defects`, per-request seeds by `seeded_sampling`), and the tied output
head rounded once (`output_head`)."""
