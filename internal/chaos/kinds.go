package chaos

// Topologies, the values of Options.Topology.
const (
	// TopologySingle is one redis-server with an append-only file fsynced
	// every second: restarts keep (almost) everything, and one restart
	// also loses the disk.
	TopologySingle = "single"
	// TopologySentinel is a primary, two replicas and three Sentinels; the
	// primary is killed and a replica promoted.
	TopologySentinel = "sentinel"
	// TopologyCluster is a Redis Cluster of three masters with a replica
	// each; a master holding partitions is killed and its replica promoted.
	TopologyCluster = "cluster"
)

// Redis faults: what a topology's dataFault does (Report.FaultsByKind).
const (
	// FaultRedisRestartEmpty is Redis losing its data: killed and started
	// again on the same address without what it had written.
	FaultRedisRestartEmpty = "redisRestartEmpty"
	// FaultRedisRestartKeepData is Redis killed (SIGKILL) and started
	// again from its append-only file (the last second may be lost).
	FaultRedisRestartKeepData = "redisRestartKeepData"
	// FaultFailover is the primary (Sentinel) or a master (Cluster) killed
	// and a replica promoted; replication is asynchronous, so the last
	// writes may be lost. The dead node is started again as a replica.
	FaultFailover = "failover"
	// FaultClientPause is CLIENT PAUSE of the primary (a master) for
	// 1.2–2 s, longer than the 1 s lease TTL: nobody can renew, and leases
	// expire when it ends.
	FaultClientPause = "clientPause"
)
