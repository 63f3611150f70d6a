"""Learning: the batcher (ring -> device batches), the train step, the optimizers."""
