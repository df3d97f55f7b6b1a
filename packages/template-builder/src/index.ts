/** @sandnode/template-builder: builds sandbox templates (rootfs dirs) from local parts. */
export * from './template-builder';
