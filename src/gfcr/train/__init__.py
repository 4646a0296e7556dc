"""gfcr.train"""
