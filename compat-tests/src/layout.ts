/**
 * Where things are in a build's tree. Releases up to 0.2.0 kept the CLI and the template
 * builder inside the server package (`services/server/dist/{cli,core}`) and the common package
 * in `shared/`; from 0.3.0 they are packages of their own (`tools/cli`, `packages/*`). Every
 * path into a build goes through this module, so each build is driven by its own layout.
 */
import { existsSync } from 'node:fs';
import path from 'node:path';

/** firstExisting returns the first of rels (relative to dir) that exists, else the first. */
function firstExisting(dir: string, rels: string[]): string {
  for (const r of rels) if (existsSync(path.join(dir, r))) return r;
  return rels[0] ?? '';
}

/** cliMainRel is the build's operator CLI entry point, relative to the build dir. */
export function cliMainRel(buildDir: string): string {
  return firstExisting(buildDir, ['tools/cli/dist/main.js', 'services/server/dist/cli/main.js']);
}

/** cliMain is the absolute path of the build's operator CLI entry point. */
export function cliMain(buildDir: string): string {
  return path.join(buildDir, cliMainRel(buildDir));
}

/** templateBuilderModule is the absolute path of the build's template builder module. */
export function templateBuilderModule(buildDir: string): string {
  return path.join(buildDir, firstExisting(buildDir, ['packages/template-builder/dist/template-builder.js', 'services/server/dist/core/template-builder.js']));
}

/** sharedDirRel is the build's common package dir, relative to the build dir. */
export function sharedDirRel(buildDir: string): string {
  return firstExisting(buildDir, ['packages/shared', 'shared']);
}

/** descriptorSetPath is the build's buf-built descriptor set. */
export function descriptorSetPath(buildDir: string): string {
  return path.join(buildDir, sharedDirRel(buildDir), 'descriptor', 'sandnode.binpb');
}

/** generatedDir is the build's compiled generated code (`.../dist/gen/sandnode`). */
export function generatedDir(buildDir: string): string {
  return path.join(buildDir, sharedDirRel(buildDir), 'dist', 'gen', 'sandnode');
}
