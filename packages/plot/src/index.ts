/** @sandnode/plot: small SVG plots for the bench and compat reports (svg.ts). */
export * from './svg';
