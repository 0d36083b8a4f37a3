"""Scoring a model: perplexity, BLEU, FLOPs, a trained run loaded back, re-discretisation."""
