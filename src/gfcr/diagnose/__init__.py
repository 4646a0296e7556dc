"""gfcr.diagnose"""
