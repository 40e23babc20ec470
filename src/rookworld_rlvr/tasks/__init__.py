"""The chess tasks: the P: policy task (`policy`), the A: environment task (`environment`), judging
moves and playing strength (`strength`) and the verifiable rewards (`rewards`). Owns chess
knowledge; no module here imports torch or anything of the model, data files or trainer.
"""
