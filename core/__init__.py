"""tessel.core: the contracts every part of tessel shares, below all of them (it imports no part).

- `errors`: the exceptions tessel raises on purpose (re-exported to users as `tessel.errors`);
- `wire`: dtypes, reduce ops and collective kinds, derived from the proto enums; numpy <-> TensorProto;
- `rpc`: gRPC plumbing (cluster token, deadlines, error mapping, servers and clients);
- `coordinator_client`: the typed client of the coordinator's service;
- `plugin`: the hardware-plugin contract (ComputePlugin, CollectivePlugin, Communicator) and the entry-point lookup;
- `collectives`: the numpy reference of every collective and reduce op.
"""
