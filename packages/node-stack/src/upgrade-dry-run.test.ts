/** `upgrade server --dry-run`'s view of a target build: its version and server features read from its dist; a build without dist is an error naming what to run. */
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { useTempDir } from '@sandnode/testkit';
import { buildServerFeatures } from './upgrade-dry-run';

describe('buildServerFeatures', () => {
  const tmp = useTempDir('sandnode-dry-run-');

  it("reads a 0.2.0 build's version and SERVER_FEATURES (no network features)", () => {
    const dir = tmp();
    mkdirSync(path.join(dir, 'packages', 'shared', 'dist'), { recursive: true });
    writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ version: '0.2.0' }));
    writeFileSync(path.join(dir, 'packages', 'shared', 'dist', 'features.js'), "exports.SERVER_FEATURES = { sandbox: 'server.sandbox.v1', fork: 'server.fork.v1' };\n");
    expect(buildServerFeatures(dir)).toEqual({ version: '0.2.0', features: ['server.sandbox.v1', 'server.fork.v1'] });
  });

  it("reads a real 0.2.0 build's layout: shared/ and SERVER_FEATURES in the server's handover/server-node.js", () => {
    const dir = tmp();
    mkdirSync(path.join(dir, 'shared', 'dist'), { recursive: true });
    mkdirSync(path.join(dir, 'services', 'server', 'dist', 'handover'), { recursive: true });
    writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ version: '0.2.0' }));
    writeFileSync(
      path.join(dir, 'services', 'server', 'dist', 'handover', 'server-node.js'),
      "/** Features this server offers (GetVersion). */\nexports.SERVER_FEATURES = ['server.sandbox.v1', 'server.takeover.v1', 'server.fork.v1'];\nexports.EPOCH_PROBE_ID = 'x';\n",
    );
    expect(buildServerFeatures(dir)).toEqual({ version: '0.2.0', features: ['server.sandbox.v1', 'server.takeover.v1', 'server.fork.v1'] });
  });

  it('a checkout that is not built says to build it', () => {
    expect(() => buildServerFeatures(tmp())).toThrow(/features\.js does not exist: build that checkout first/);
  });
});
