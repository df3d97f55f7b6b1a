/** @sandnode/server: the server daemon. Exports its config schema for tools that check deploy configs. */
export { resolveServerConfig, serverConfigSchema, type ServerConfig } from './config';
