/**
 * Jest: unit tests (`*.test.ts` beside the code) and integration tests (`*.it.test.ts`, which
 * need root, runc and loop devices and start real service processes on unix sockets). Select
 * with `npx jest PATH --selectProjects unit` (the path goes first: after --selectProjects a
 * path is read as another project name).
 */
const transform = { '^.+\\.ts$': ['ts-jest', { tsconfig: '<rootDir>/tsconfig.json' }] };
const roots = ['<rootDir>/shared/src', '<rootDir>/services', '<rootDir>/compat-tests/src'];
const testPathIgnorePatterns = ['/node_modules/', '/dist/'];
module.exports = {
  // testTimeout is a global option (ignored inside projects); integration files also set their own.
  testTimeout: 120000,
  projects: [
    { displayName: 'unit', rootDir: __dirname, roots, transform, testEnvironment: 'node', testMatch: ['**/*.test.ts'], testPathIgnorePatterns: [...testPathIgnorePatterns, '\\.it\\.test\\.ts$'] },
    { displayName: 'integration', rootDir: __dirname, roots, transform, testEnvironment: 'node', testMatch: ['**/*.it.test.ts'], testPathIgnorePatterns },
  ],
};
