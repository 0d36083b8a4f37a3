"""The library's benchmarks in one place, outside the model packages and the harness.

Each module holds the benchmarks of one subject; each benchmark is a function
``() -> list[dict]`` (one record per measurement: ``bench``, ``metric``, ``value``,
``target``, ``unit``, ``better``, plus raw numbers), registered by name in
``experiments.cli.bench.BENCHMARKS``, which ``odelm bench NAME`` reads. Every comparison is
timed with [`odelm.timing`][odelm.timing] (variants interleaved in alternating order inside one
process, medians), so machine load and warm caches hit all variants alike.

This package sits on top of the layering: it may import every other package of the
library, and none imports it (``odelm bench`` resolves its registry's strings).
"""
