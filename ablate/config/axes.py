"""A trial's axes: the fields every run row keeps as real columns (so SQL can group and filter on them), in the
order tables and the dashboard show them. Plain names, importable without pydantic: the store reads them too."""

AXIS_FIELDS = ("architecture", "objective", "d_model", "layers", "heads", "context", "lr", "batch_size", "seed")
