"""Figures: a tidy table and keyword options in, a matplotlib Axes out."""
