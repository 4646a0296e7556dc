"""gfcr.replay: replay buffers (FIFO, RePO, ExGRPO, AR3PO) and retrieval of similar solved cases.
Name -> class table: ``BUFFERS``."""

from gfcr.replay.buffers import AR3PO, BUFFERS, FIFO, ExGRPO, ReplayBuffer, ReplaySample, RePO, make_buffer
from gfcr.replay.retrieval import HashEmbedding, Retrieval

__all__ = ["AR3PO", "BUFFERS", "FIFO", "ExGRPO", "HashEmbedding", "RePO", "ReplayBuffer", "ReplaySample",
           "Retrieval", "make_buffer"]
