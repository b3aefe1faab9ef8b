"""A/B benchmark pieces: request workloads, arrival traces and result reports."""
