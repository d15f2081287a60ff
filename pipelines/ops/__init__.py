"""What sfcdc records about its own work: the commits table (:mod:`pipelines.ops.table`),
lag and health from it (:mod:`pipelines.ops.health`), and Prometheus metrics
(:mod:`pipelines.ops.metrics`)."""
