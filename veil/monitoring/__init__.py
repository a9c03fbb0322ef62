"""The broker's figures (SPEC §8), counted where the work happens and exposed from one place."""
