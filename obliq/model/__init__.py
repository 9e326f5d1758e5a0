"""The bi-encoder (backbone, bidirectional attention, LoRA, pooling) and its GradCache step."""

from obliq.model.encoder import BiEncoder, LoraSettings, check_bidirectional, make_bidirectional
from obliq.model.pooling import mean_pool
from obliq.model.tokenizer import TextTokenizer

__all__ = ["BiEncoder", "LoraSettings", "TextTokenizer", "check_bidirectional", "make_bidirectional", "mean_pool"]
