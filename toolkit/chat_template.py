"""Placeholder; replaced by the chat template reduction."""
def reduce_template(template, vocab):
    return None
