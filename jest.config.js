/**
 * Jest: unit tests (`*.test.ts` beside the code) and integration tests (`*.it.test.ts`, which
 * need root, runc and loop devices and start real service processes on unix sockets). Select
 * with `--selectProjects unit` or `--selectProjects integration`.
 */
const transform = { '^.+\\.ts$': ['ts-jest', { tsconfig: '<rootDir>/tsconfig.json' }] };
const roots = ['<rootDir>/shared/src', '<rootDir>/services', '<rootDir>/compat-tests/src'];
const testPathIgnorePatterns = ['/node_modules/', '/dist/'];
module.exports = {
  projects: [
    { displayName: 'unit', rootDir: __dirname, roots, transform, testEnvironment: 'node', testMatch: ['**/*.test.ts'], testPathIgnorePatterns: [...testPathIgnorePatterns, '\\.it\\.test\\.ts$'] },
    { displayName: 'integration', rootDir: __dirname, roots, transform, testEnvironment: 'node', testMatch: ['**/*.it.test.ts'], testPathIgnorePatterns, testTimeout: 120000 },
  ],
};
