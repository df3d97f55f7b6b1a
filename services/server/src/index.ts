/** @sandnode/server: the server daemon (main.ts). Exports its config loader and schema for tools that check deploy configs. */
export {
  configSchema,
  loadServerConfig,
  SERVICE,
  DEFAULT_PEER_CALL_TIMEOUT_MS,
  DEFAULT_PEER_RETRY_ATTEMPTS,
  DEFAULT_PODD_CALL_TIMEOUT_MS,
  DEFAULT_PODD_RETRY_ATTEMPTS,
  DEFAULT_PEER_START_TIMEOUT_MS,
  DEFAULT_HANDOVER_CALL_TIMEOUT_MS,
  DEFAULT_HANDOVER_FD_TIMEOUT_MS,
  DEFAULT_LEASE_ACQUIRE_TIMEOUT_MS,
  DEFAULT_DRAIN_CONCURRENCY,
  DEFAULT_DRAIN_DEADLINE_MS,
  type ServerConfig,
} from './config';
export { HANDOVER_FAILPOINTS, FORK_FAILPOINTS, SERVER_FAILPOINTS_ENV, type ServerFailpoint } from './handover/failpoints';
// the server's metrics (registered in shared's registry on load), so tools that check the
// dashboard against the registry (deploy/grafana.test.ts) see every one
import './metrics';
import './core/pool-metrics';
