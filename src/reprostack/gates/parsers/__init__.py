"""Parsers of gate outputs: each turns raw log text into numbers plus the problems found on the way."""
