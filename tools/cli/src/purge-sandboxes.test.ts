import type { ServerApi } from '@sandnode/node-stack';
import { ClientError, Status } from 'nice-grpc-common';
import { deleteAllSandboxes, purgedNetworkText } from './purge-sandboxes';

const rpc = '/sandnode.server.v1.SandboxService/DeleteSandbox';

/** an API that lists ids and answers each DeleteSandbox with what answers[id] says (undefined: deleted) */
function fakeApi(ids: string[], answers: Record<string, ClientError | Error>): { api: ServerApi; asked: string[] } {
  const asked: string[] = [];
  const sandboxes = {
    listSandboxes: async () => ({ sandboxes: ids.map((sandboxId) => ({ sandboxId })), nextPageToken: '' }),
    deleteSandbox: async ({ sandboxId }: { sandboxId: string }) => {
      asked.push(sandboxId);
      const err = answers[sandboxId];
      if (err) throw err;
      return {};
    },
  };
  return { api: { sandboxes } as unknown as ServerApi, asked };
}

describe('deleteAllSandboxes (down --purge with the server running)', () => {
  it('takes NOT_FOUND on a delete as done: a sandbox the reaper or another purge finished between list and delete', async () => {
    const { api, asked } = fakeApi(['sb-a', 'sb-b', 'sb-c'], { 'sb-b': new ClientError(rpc, Status.NOT_FOUND, 'sandbox sb-b not found') });
    const r = await deleteAllSandboxes(api);
    expect(asked.sort()).toEqual(['sb-a', 'sb-b', 'sb-c']);
    expect({ deleted: r.deleted.sort(), gone: r.gone }).toEqual({ deleted: ['sb-a', 'sb-c'], gone: ['sb-b'] });
  });

  it('names every sandbox that could not be deleted with its code and message, after trying all of them', async () => {
    const { api, asked } = fakeApi(['sb-a', 'sb-b', 'sb-c'], {
      'sb-a': new ClientError(rpc, Status.FAILED_PRECONDITION, 'umount /run/vms/sb-a/workspace: /run/vms/sb-a/workspace/mine is mounted below it'),
      'sb-c': new Error('connection dropped'),
    });
    await expect(deleteAllSandboxes(api)).rejects.toThrow(
      /^could not delete 2 of 3 sandboxes, so nothing was stopped or purged: (?=.*sb-a: FAILED_PRECONDITION: umount \/run\/vms\/sb-a\/workspace: \/run\/vms\/sb-a\/workspace\/mine is mounted below it)(?=.*sb-c: connection dropped)/,
    );
    expect(asked.sort()).toEqual(['sb-a', 'sb-b', 'sb-c']);
  });
});

describe('purgedNetworkText', () => {
  it("names the node's nftables table, interfaces and netns mounts that down --purge removed", () => {
    expect(purgedNetworkText({ table: true, ifaces: ['sn6036v0', 'sn6036v1'], netns: [0, 1] })).toBe('removed network: nftables table yes, interfaces: sn6036v0 sn6036v1, netns: 0 1');
    expect(purgedNetworkText({ table: false, ifaces: [], netns: [] })).toBe('removed network: nftables table none, interfaces: none, netns: none');
  });
});
