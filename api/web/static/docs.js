// Swagger UI on /openapi.json: its script is served by this API from a packaged copy (the page
// at "/" keeps its key in this origin's storage, so no script comes from elsewhere), and this
// file starts it, since the pages' policy runs no inline script.
"use strict";

// Deferred after the bundle, so it is loaded and the page parsed.
window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
});
