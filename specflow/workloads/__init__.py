"""Traffic classes: offline prompt generators, packaged datasets, HF-cache readers, rendering."""
