"""Data on disk: samples (`io`), upstream imports (`importer`), generated sets (`generate`) and
judged held-out sets (`judged`). Owns files and their formats; chess only: no module here imports
torch or anything of the model or trainer.
"""
