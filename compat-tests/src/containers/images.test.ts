import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { useTempDir } from '@sandnode/testkit';
import { REPO_ROOT } from '../releases';
import { buildPaths, imageName, usesReleaseImage } from './images';

const tmp = useTempDir('compat-images-');

function tree(files: string[]): string {
  const dir = tmp();
  for (const f of files) {
    mkdirSync(path.dirname(path.join(dir, f)), { recursive: true });
    writeFileSync(path.join(dir, f), '');
  }
  return dir;
}

describe('buildPaths', () => {
  it('takes an old-layout build (0.2.0: the CLI in services/server, shared/) as it is', () => {
    const dir = tree([
      'package.json',
      'shared/package.json',
      'shared/dist/index.js',
      'shared/descriptor/sandnode.binpb',
      'services/server/package.json',
      'services/server/dist/cli/main.js',
      'services/server/src/main.ts',
      'deploy/prestop.sh',
    ]);
    expect(buildPaths(dir).sort()).toEqual(['deploy', 'package.json', 'services/server/dist', 'services/server/package.json', 'shared/descriptor', 'shared/dist', 'shared/package.json']);
  });
  it('takes a new-layout build (packages/*, tools/*, services/*: package.json, dist, bin; the shared descriptor)', () => {
    const dir = tree([
      'package.json',
      'node_modules/x/index.js',
      'packages/shared/package.json',
      'packages/shared/dist/index.js',
      'packages/shared/descriptor/sandnode.binpb',
      'packages/shared/src/index.ts',
      'tools/cli/package.json',
      'tools/cli/dist/main.js',
      'tools/cli/bin/sandnode.js',
      'services/podd/dist/podd.bundle.js',
      'services/vmm-supervisor/seccomp/sandbox.json',
    ]);
    expect(buildPaths(dir).sort()).toEqual([
      'node_modules',
      'package.json',
      'packages/shared/descriptor',
      'packages/shared/dist',
      'packages/shared/package.json',
      'services/podd/dist',
      'services/vmm-supervisor/seccomp',
      'tools/cli/bin',
      'tools/cli/dist',
      'tools/cli/package.json',
    ]);
  });
});

describe('imageName', () => {
  it('is sandnode-compat:<label>-<commit12> with the label made a valid tag', () => {
    expect(imageName({ label: 'N', version: '0.3.0', commit: 'abcdef0123456789', dir: '/' })).toBe('sandnode-compat:N-abcdef012345');
    expect(imageName({ label: '0.2.0+x', version: '0.2.0', commit: 'a'.repeat(40), dir: '/' })).toBe('sandnode-compat:0.2.0-x-aaaaaaaaaaaa');
  });
});

describe('usesReleaseImage', () => {
  it('is true for this checkout (N runs from sandnode:<version>, the release image), false for a cached release build', () => {
    expect(usesReleaseImage({ dir: REPO_ROOT })).toBe(true);
    expect(usesReleaseImage({ dir: `${REPO_ROOT}/` })).toBe(true);
    expect(usesReleaseImage({ dir: `${REPO_ROOT}/compat-tests/.cache/builds/0.2.0-a414803acff4` })).toBe(false);
  });
});
