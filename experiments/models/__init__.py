"""Building any model of the library from a run config's ``model:`` section, checked first
against that model's typed config and its size."""
