/**
 * The CLI's calls to the node's server: one connection per command, closed when it ends, and
 * the paging of ListSandboxes.
 */
import { connectServer, type ServerApi } from '@sandnode/node-stack';
import type { ListSandboxesRequest, Sandbox } from '@sandnode/shared/proto/server/v1/sandbox';
import type { ClientAuth } from '@sandnode/shared';

/** Sandboxes per ListSandboxes page the CLI asks for (the API's maximum). */
export const LIST_PAGE_SIZE = 1000;

/** withServer connects to the server's public API at target.address (with target.auth: --token, --tls-*), runs fn and closes the connection however fn ends. */
export async function withServer<T>(target: { address: string; auth?: ClientAuth }, fn: (api: ServerApi) => Promise<T>): Promise<T> {
  const api = connectServer(target.address, undefined, target.auth);
  try {
    return await fn(api);
  } finally {
    api.close();
  }
}

/** listAllSandboxes pages through ListSandboxes with filter (states, metadata) and returns every sandbox, ordered by id. */
export async function listAllSandboxes(api: ServerApi, filter: Pick<Partial<ListSandboxesRequest>, 'states' | 'metadata'> = {}): Promise<Sandbox[]> {
  const all: Sandbox[] = [];
  let token = '';
  do {
    const page = await api.sandboxes.listSandboxes({ ...filter, pageSize: LIST_PAGE_SIZE, pageToken: token });
    all.push(...page.sandboxes);
    token = page.nextPageToken;
  } while (token);
  return all;
}
