"""Generated stubs of Salesforce's ``eventbus.v1.PubSub`` service (see ``proto/pubsub_api.proto``).

Regenerate with ``python -m ingest.protogen``; never edit the ``pubsub_api_pb2*`` files by hand.
"""

from . import pubsub_api_pb2 as pb2
from . import pubsub_api_pb2_grpc as pb2_grpc

__all__ = ["pb2", "pb2_grpc"]
