// ESLint (flat config): typescript-eslint with type information, import-x for cycles, and the
// project's own boundaries. `npm run lint` runs it with Prettier's check and shellcheck.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';
import importX from 'eslint-plugin-import-x';
import { createTypeScriptImportResolver } from 'eslint-import-resolver-typescript';
import prettier from 'eslint-config-prettier';

const DEEP_SRC = {
  group: ['@sandnode/*/src', '@sandnode/*/src/*', '../../*/src/*', '../../../*/src/*', '**/services/*/src/*', '**/packages/*/src/*', '**/tools/*/src/*'],
  message: 'import another package by its name and exports, never its src/',
};

export default tseslint.config(
  { ignores: ['**/node_modules/**', '**/dist/**', 'packages/shared/src/gen/**', 'compat-tests/.cache/**', 'compat-tests/report/**', 'coverage/**', '.sandnode/**', '.toolchain/**'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    files: ['**/*.ts'],
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    plugins: { 'import-x': importX },
    settings: {
      'import-x/resolver-next': [createTypeScriptImportResolver({ project: './tsconfig.json' })],
    },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-misused-promises': ['error', { checksVoidReturn: false }],
      '@typescript-eslint/consistent-type-imports': ['error', { fixStyle: 'inline-type-imports' }],
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrors: 'none' }],
      '@typescript-eslint/no-require-imports': 'off',
      'import-x/no-cycle': ['error', { ignoreExternal: true }],
      'import-x/no-duplicates': 'error',
      // every import is declared in the importing package's own package.json
      'import-x/no-extraneous-dependencies': ['error', { includeInternal: false, includeTypes: true }],
      'no-restricted-imports': ['error', { patterns: [DEEP_SRC] }],
    },
  },
  {
    // Domain code never sees the wire types (STYLE.md: core/ has no proto imports).
    files: ['services/*/src/core/**/*.ts'],
    ignores: ['**/*.test.ts'],
    rules: {
      'no-restricted-imports': ['error', { patterns: [DEEP_SRC, { group: ['@sandnode/shared/proto/*'], message: 'core/ has no proto imports: convert in rpc/convert.ts' }] }],
    },
  },
  {
    // Daemons log through pino.
    files: ['services/*/src/**/*.ts'],
    ignores: ['**/*.test.ts', '**/__tests__/**'],
    rules: { 'no-console': 'error' },
  },
  {
    files: ['**/*.js', '**/*.cjs', '**/*.mjs'],
    languageOptions: {
      sourceType: 'commonjs',
      globals: {
        AbortSignal: 'readonly',
        __filename: 'readonly',
        require: 'readonly',
        module: 'writable',
        process: 'readonly',
        __dirname: 'readonly',
        console: 'readonly',
        Buffer: 'readonly',
        setTimeout: 'readonly',
        clearTimeout: 'readonly',
      },
    },
    rules: { '@typescript-eslint/no-require-imports': 'off' },
  },
  { files: ['**/*.mjs'], languageOptions: { sourceType: 'module' } },
  prettier,
);
