"""gfcr.generate"""
