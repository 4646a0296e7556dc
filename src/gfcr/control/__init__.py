"""gfcr.control"""
