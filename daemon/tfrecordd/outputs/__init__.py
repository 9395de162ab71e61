"""Where shards go: shard files being written, their manifests, and the outputs that publish
them (a local directory, an object store)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tfrecordd.config import DaemonConfig
    from tfrecordd.fsys import FileSystem
    from tfrecordd.metrics import Metrics
    from tfrecordd.outputs.output import Output

__all__ = ["make_output"]


def make_output(
    config: DaemonConfig,
    fs: FileSystem,
    metrics: Metrics | None = None,
    dataset: str | None = None,
) -> Output:
    """The output of a config's dataset (default: its first): a local directory for paths and
    ``file://`` / ``local://`` URLs, an fsspec file system (an object store) for other URLs.
    Each kind is imported only when used: a local output never imports fsspec."""
    from tfrecordd.fsys import is_url, local_path

    dataset = next(iter(config.datasets)) if dataset is None else dataset
    out = config.datasets[dataset]
    location = out.dir
    if not is_url(location):
        from tfrecordd.outputs.output import LocalOutput

        return LocalOutput(
            local_path(location),
            fs,
            node_id=config.daemon.node_id,
            fsync=out.fsync,
        )
    from tfrecordd.outputs.objectstore import FsspecOutput

    return FsspecOutput(config, fs, metrics, dataset=dataset)
