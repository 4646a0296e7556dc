"""gfcr.filters"""
