"""gfcr.replay: replay buffers (FIFO, RePO, ExGRPO, AR3PO) and retrieval of similar solved cases
(whole prompts and solution steps). Name -> class tables: ``BUFFERS``, ``EMBEDDINGS``."""

from gfcr.replay.buffers import AR3PO, BUFFERS, FIFO, ExGRPO, ReplayBuffer, ReplaySample, RePO, make_buffer
from gfcr.replay.embeddings import EMBEDDINGS, HashEmbedding, MiniLMEmbedding, make_embedding
from gfcr.replay.retrieval import Neighbour, Retrieval, SegmentNeighbour, split_steps

__all__ = ["AR3PO", "BUFFERS", "EMBEDDINGS", "FIFO", "ExGRPO", "HashEmbedding", "MiniLMEmbedding", "Neighbour",
           "RePO", "ReplayBuffer", "ReplaySample", "Retrieval", "SegmentNeighbour", "make_buffer", "make_embedding",
           "split_steps"]
