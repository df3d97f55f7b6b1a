/**
 * Jest: unit tests (`*.test.ts` beside the code) and integration tests (`*.it.test.ts`, which
 * need root, runc and loop devices and start real service processes on unix sockets). Select
 * with `npx jest PATH --selectProjects unit` (the path goes first: after --selectProjects a
 * path is read as another project name).
 *
 * `@sandnode/*` imports resolve to each package's TypeScript source (moduleNameMapper), so the
 * tests test the code, never a stale `dist/`. Daemons that tests start as processes run from
 * `dist/` (`npm run build` first; the integration suites say so when it is missing).
 */
const transform = { '^.+\\.ts$': ['ts-jest', { tsconfig: '<rootDir>/tsconfig.json' }] };
const roots = ['<rootDir>/packages', '<rootDir>/services', '<rootDir>/tools', '<rootDir>/compat-tests/src', '<rootDir>/deploy'];
const testPathIgnorePatterns = ['/node_modules/', '/dist/'];
/** Where each workspace package lives. */
const PACKAGES = {
  shared: 'packages/shared',
  testkit: 'packages/testkit',
  'template-builder': 'packages/template-builder',
  'node-stack': 'packages/node-stack',
  plot: 'packages/plot',
  podd: 'services/podd',
  'vmm-supervisor': 'services/vmm-supervisor',
  'ublk-manager': 'services/ublk-manager',
  server: 'services/server',
};
const moduleNameMapper = {
  '^@sandnode/shared/proto/(.*)$': '<rootDir>/packages/shared/src/gen/sandnode/$1',
  '^@sandnode/shared/descriptor$': '<rootDir>/packages/shared/descriptor/sandnode.binpb',
};
for (const [name, dir] of Object.entries(PACKAGES)) moduleNameMapper[`^@sandnode/${name}$`] = `<rootDir>/${dir}/src/index.ts`;
const common = { rootDir: __dirname, roots, transform, testEnvironment: 'node', moduleNameMapper };
module.exports = {
  // testTimeout is a global option (ignored inside projects); integration files also set their own.
  testTimeout: 120000,
  // jest.sequencer.js: jest's order, with the few files that must run on a fresh process first
  testSequencer: '<rootDir>/jest.sequencer.js',
  projects: [
    { displayName: 'unit', ...common, testMatch: ['**/*.test.ts'], testPathIgnorePatterns: [...testPathIgnorePatterns, '\\.it\\.test\\.ts$'] },
    { displayName: 'integration', ...common, testMatch: ['**/*.it.test.ts'], testPathIgnorePatterns },
  ],
};
