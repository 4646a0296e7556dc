"""gfcr.ross"""
