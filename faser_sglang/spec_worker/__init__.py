"""The FASER worker: per-request draft lengths, ragged verify, lossless acceptance."""
