// dpatlas web map: a choropleth of one release's published p25 or p75 per census tract (and,
// when the release publishes them, per county and state), read from the release's PMTiles
// archives with HTTP range requests. Every URL is relative to the
// page, so it works from any static host that serves ranges, and offline (no CDN, no basemap).
// Colours and classes come from the release's legend.json, written by
// dpatlas/publication/webmap/__init__.py from dpatlas/publication/colours.py (the PNG map's
// scale too). MapLibre and PMTiles are the publish root's one copy (../_lib/).
(function () {
  "use strict";

  const config = JSON.parse(document.getElementById("dpatlas-config").textContent);
  // Each geography level's archive and layer (dpatlas.publication.tiles LAYER, LEVEL_TILES).
  const LEVELS = {
    tract: { file: "tracts.pmtiles", layer: "tracts", noun: "Tract", plural: "Tracts" },
    county: { file: "counties.pmtiles", layer: "counties", noun: "County", plural: "Counties" },
    state: { file: "states.pmtiles", layer: "states", noun: "State", plural: "States" },
  };
  const LAYER = LEVELS.tract.layer;
  // The level shown by zoom unless the switch fixes one: states below z5 (several states on
  // a screen), counties below z8, tracts from z8 (an urban tract is a few pixels wide there).
  const ZOOM_LEVELS = [[5, "state"], [8, "county"]];
  const HATCH = "low-reliability-hatch";
  const DOTS = "model-only-dots";
  // Layer kinds drawn per level, bottom to top ("dots" and "flag": tracts in model mode).
  const KINDS = ["fill", "hatch", "dots", "line", "flag"];
  // What every value estimates, and what its ± and interval mean, come from legend.json's
  // "estimand" (written from mechanisms/estimand.py by dpatlas/publication/webmap): one
  // estimand, the tract expected outcome, for direct and model-based values alike.
  // level: the intervals' confidence level; levels: the geography levels of the release;
  // fixedLevel: the level the switch fixes (null: by zoom); shownLevel: the one drawn;
  // estimate: "model" or "direct" (tracts only, when the tiles carry p25_model).
  const state = { release: null, value: "p25", cell: null, statuses: [], level: null,
                  legend: null, releases: [], mechanisms: [], levels: ["tract"],
                  fixedLevel: null, shownLevel: "tract", hasModel: false, estimate: "direct",
                  unitTables: {}, minZoom: {}, bounds: null, popup: null, geojson: {},
                  cellTiles: null, levelCellTiles: null, tractParts: null,
                  tractValues: null, valueFiles: null, valueDocs: {}, applied: new Set(),
                  pendingValues: 0 };
  // For tests and the curious: the map, the state, and the id of the release last drawn.
  const api = (window.dpatlas = { state: state, map: null, loaded: null });

  const protocol = new pmtiles.Protocol();
  maplibregl.addProtocol("pmtiles", protocol.tile);

  const $ = (id) => document.getElementById(id);
  const DEFAULT_TITLE = document.title;
  const absolute = (relative) => new URL(relative, document.baseURI).href;

  // A release page shows its own files from its own folder ("./"), so it also works when the
  // folder is served alone; any other release is a sibling folder under releaseBase.
  function releaseUrl(id, file) {
    if (id === config.release) return absolute(file);
    return absolute(config.releaseBase + encodeURIComponent(id) + "/" + file);
  }

  // The same file as a link relative to the page (what a user copies or saves).
  function releaseHref(id, file) {
    return id === config.release ? file : config.releaseBase + encodeURIComponent(id) + "/" + file;
  }

  async function fetchJson(url) {
    const response = await fetch(url, { cache: "no-cache" });
    if (!response.ok) throw new Error(url + ": HTTP " + response.status);
    return response.json();
  }

  function showError(message) {
    $("error").textContent = message;
    $("error").hidden = false;
    console.error("dpatlas web map: " + message);
  }

  // ---------------------------------------------------------------- styling from the legend

  // The property a level's colour shows: the model-based value for tracts when chosen (the
  // model is fitted to tracts; counties and states show their direct estimates).
  function shownProperty(level) {
    return level === "tract" && state.estimate === "model" ? state.value + "_model" : state.value;
  }

  // A release whose manifest has tract_values tiles each tract's polygon once, with its GEOID
  // alone, and publishes each cell and state's values apart
  // (dpatlas/publication/tract_values.py): the tract layer then reads a unit's values from
  // its feature state (set from those documents by its GEOID), not from its properties.
  const valuesApart = (level) => level === "tract" && state.tractValues !== null;

  // A unit's value of ``name`` in a style expression, and whether it has one.
  function prop(level, name) {
    return valuesApart(level) ? ["feature-state", name] : ["get", name];
  }
  function has(level, name) {
    return valuesApart(level) ? ["!=", ["feature-state", name], null] : ["has", name];
  }

  function fillColour(level) {
    const lg = state.legend, property = shownProperty(level);
    const steps = ["step", ["to-number", prop(level, property), 0], lg.classes[0].colour];
    lg.breaks.forEach((b, i) => steps.push(b, lg.classes[i + 1].colour));
    if (property !== state.value) {
      // A model value may exist where the direct one was not published; without one the
      // unit shows its status's colour.
      return ["case", has(level, property), steps,
              ["match", prop(level, "status"), "failed", lg.status.failed.colour,
               lg.status.suppressed.colour]];
    }
    return ["match", prop(level, "status"),
            "suppressed", lg.status.suppressed.colour,
            "failed", lg.status.failed.colour,
            steps];
  }

  // The shown cell's features: with values apart every polygon is every cell's (its
  // feature state holds the shown cell's values).
  function cellFilter(level) {
    return state.cell === null || valuesApart(level) ? true : ["==", ["get", "cell"], state.cell];
  }

  // The legend's class (0, 1, ...) of a numeric property: the fill's step over the breaks.
  function classOf(level, property) {
    const steps = ["step", ["to-number", prop(level, property), 0], 0];
    state.legend.breaks.forEach((b, i) => steps.push(b, i + 1));
    return steps;
  }

  // Low reliability: a coloured unit whose interval [lo, hi] of the shown value spans more
  // than one colour class (its ends in different classes), direct and model values alike, as
  // p25_map.png hatches it (dpatlas.publication.colours.spans_classes). "has" comes first so
  // a unit without bounds is never evaluated.
  function hatchFilter(level) {
    const property = shownProperty(level);
    const lo = property + "_lo", hi = property + "_hi";
    const released = property === state.value ? ["==", prop(level, "status"), "released"]
      : true;
    return ["all", cellFilter(level), released,
            has(level, property), has(level, lo), has(level, hi),
            ["!=", classOf(level, lo), classOf(level, hi)]];
  }

  // Model mode, tracts: coloured by a model value though no direct value was published
  // (suppressed: too few records; failed).
  function dotsFilter(level) {
    if (shownProperty(level) === state.value) return false;
    return ["all", cellFilter(level), has(level, shownProperty(level)),
            ["!=", prop(level, "status"), "released"]];
  }

  // Model mode, tracts: the model may not apply (|value_model_z| above the legend's limit).
  function flagFilter(level) {
    if (shownProperty(level) === state.value) return false;
    const z = state.value + "_model_z", limit = Number(estimandText("model_z_limit"));
    return ["all", cellFilter(level), has(level, z),
            [">", ["abs", ["to-number", prop(level, z), 0]], limit]];
  }

  // An 8 x 8 pattern of ``colour`` where ``on(x, y)``: the hatch's diagonal, the dots.
  function patternImage(colour, on) {
    const size = 8, data = new Uint8Array(size * size * 4);
    const rgb = [1, 3, 5].map((i) => parseInt(colour.slice(i, i + 2), 16));
    for (let y = 0; y < size; y++) {
      for (let x = 0; x < size; x++) {
        if (!on(x, y, size)) continue;
        const k = (y * size + x) * 4;
        data.set([rgb[0], rgb[1], rgb[2], 255], k);
      }
    }
    return { width: size, height: size, data: data };
  }
  const hatchPixel = (x, y, size) => (x + y) % size === 0;
  const dotPixel = (x, y) => (x === 1 || x === 2) && (y === 1 || y === 2);

  // Layer ids of a level: "tracts-fill", "counties-hatch", ... (the source is the layer name).
  const layerId = (level, kind) => LEVELS[level].layer + "-" + kind;

  function addLayers(map, level, url) {
    const source = LEVELS[level].layer, visibility = level === state.shownLevel ? "visible" : "none";
    map.addSource(source, { type: "vector", url: "pmtiles://" + url,
                            ...(valuesApart(level) ? { promoteId: { [source]: "geoid" } } : {}) });
    const common = { source: source, "source-layer": source, layout: { visibility: visibility } };
    map.addLayer({ id: layerId(level, "fill"), type: "fill", ...common,
                   paint: { "fill-antialias": false } });
    map.addLayer({ id: layerId(level, "hatch"), type: "fill", ...common,
                   paint: { "fill-pattern": HATCH } });
    if (level === "tract") {
      map.addLayer({ id: layerId(level, "dots"), type: "fill", ...common,
                     paint: { "fill-pattern": DOTS } });
    }
    map.addLayer({ id: layerId(level, "line"), type: "line", ...common,
                   paint: { "line-color": "#ffffff", "line-width": level === "tract" ? 0.4 : 0.8,
                            "line-opacity": 0.7 } });
    if (level === "tract") {
      map.addLayer({ id: layerId(level, "flag"), type: "line", ...common,
                     paint: { "line-color": state.legend.model_flag.colour, "line-width": 2 } });
    }
    styleLevel(map, level);
  }

  // Which units each layer of a level draws, and the fill's colours, for the shown value,
  // estimate and cell. A layer filter cannot read a feature state, so with values apart the
  // same conditions set each layer's opacity instead (a unit whose values have not arrived
  // yet is not drawn).
  function styleLevel(map, level) {
    const marks = [["fill", "fill-opacity", valuesApart(level) ? has(level, "status")
                                                               : cellFilter(level)],
                   ["hatch", "fill-opacity", hatchFilter(level)],
                   ["dots", "fill-opacity", dotsFilter(level)],
                   ["line", "line-opacity", cellFilter(level)],
                   ["flag", "line-opacity", flagFilter(level)]];
    map.setPaintProperty(layerId(level, "fill"), "fill-color", fillColour(level));
    for (const [kind, opacity, where] of marks) {
      const id = layerId(level, kind);
      if (!map.getLayer(id)) continue;
      const full = kind === "line" ? 0.7 : 1;
      if (valuesApart(level)) {
        map.setFilter(id, null);
        map.setPaintProperty(id, opacity, ["case", where, full, 0]);
      } else {
        map.setFilter(id, where === true ? null : where);
        map.setPaintProperty(id, opacity, full);
      }
    }
  }

  // County and state outlines above every fill, at every zoom and whichever level is shown:
  // the level archives' polygons (the tracts dissolved by unit), drawn as lines.
  const OUTLINES = { county: { colour: "#4d4d4d", width: 0.7 },
                     state: { colour: "#111111", width: 1.6 } };

  function addOutlines(map) {
    for (const level of ["county", "state"]) {
      if (!state.levels.includes(level)) continue;
      const source = LEVELS[level].layer;
      map.addLayer({ id: layerId(level, "outline"), type: "line", source: source,
                     "source-layer": source, filter: cellFilter(level),
                     paint: { "line-color": OUTLINES[level].colour,
                              "line-width": OUTLINES[level].width } });
    }
  }

  // The 48 contiguous states' outlines (states_context.geojson, beside the app: public
  // geography, not the release's data) under every layer of the release, up to zoom 8: the
  // release does not float on an empty background when zoomed out.
  const CONTEXT = { file: "states_context.geojson", maxzoom: 8, fill: "#ebe9e4",
                    line: "#a3a3a3" };

  function addContext(map) {
    map.addSource("states-context", { type: "geojson",
                                      data: absolute(config.assets + CONTEXT.file) });
    map.addLayer({ id: "states-context-fill", type: "fill", source: "states-context",
                   maxzoom: CONTEXT.maxzoom, paint: { "fill-color": CONTEXT.fill } });
    map.addLayer({ id: "states-context-line", type: "line", source: "states-context",
                   maxzoom: CONTEXT.maxzoom,
                   paint: { "line-color": CONTEXT.line, "line-width": 0.6 } });
  }

  function removeRelease(map) {
    closePopup();
    for (const level of Object.keys(LEVELS)) {
      for (const kind of ["outline", ...KINDS.slice().reverse()]) {
        if (map.getLayer(layerId(level, kind))) map.removeLayer(layerId(level, kind));
      }
      if (map.getSource(LEVELS[level].layer)) map.removeSource(LEVELS[level].layer);
    }
  }

  // The level to draw: the one the switch fixes, else the zoom's among the release's levels.
  function levelToShow(zoom) {
    if (state.fixedLevel && state.levels.includes(state.fixedLevel)) return state.fixedLevel;
    for (const [below, level] of ZOOM_LEVELS) {
      if (zoom < below && state.levels.includes(level)) return level;
    }
    return "tract";
  }

  function showLevel(map) {
    const level = levelToShow(map.getZoom());
    if (level === state.shownLevel && map.getLayer(layerId(level, "fill"))
        && map.getLayoutProperty(layerId(level, "fill"), "visibility") === "visible") {
      showDataMessage(map);
      return;
    }
    state.shownLevel = level;
    if (state.popup && state.popup.level !== level) closePopup();
    for (const other of state.levels) {
      for (const kind of KINDS) {
        if (map.getLayer(layerId(other, kind))) {
          map.setLayoutProperty(layerId(other, kind), "visibility",
                                other === level ? "visible" : "none");
        }
      }
    }
    drawLegend();
    showDataMessage(map);
  }

  // ------------------------------------------------------------------ nothing drawn: say so

  // Why the view shows no data, or null: below the shown level's tiles (the archive's
  // minimum zoom; above its maximum MapLibre over-zooms, so nothing is lost there), or looking
  // away from the release's extent.
  function dataMessage(map) {
    if (!state.bounds) return null;
    const level = state.shownLevel, zoom = map.getZoom(), min = state.minZoom[level];
    const plural = LEVELS[level].plural.toLowerCase();
    if (min !== undefined && zoom < min) {
      return "Zoom in to see data: " + plural + " are drawn from zoom " + min + " (now "
        + zoom.toFixed(1) + ").";
    }
    const view = map.getBounds(), [[west, south], [east, north]] = state.bounds;
    if (view.getWest() > east || view.getEast() < west || view.getSouth() > north
        || view.getNorth() < south) {
      return "Zoom out to see data: no published " + plural + " in view.";
    }
    return null;
  }

  // The message over the map; an open popup closes with its unit no longer drawn.
  function showDataMessage(map) {
    const text = dataMessage(map), box = $("data-message");
    $("data-message-text").textContent = text || "";
    box.hidden = !text;
    if (text) closePopup();
  }

  // ------------------------------------------------------------------------------- legend

  function swatchRow(parent, colour, label, extraClass) {
    const row = document.createElement("div");
    row.className = "row";
    const swatch = document.createElement("span");
    swatch.className = "swatch" + (extraClass ? " " + extraClass : "");
    if (colour) swatch.style.background = colour;
    const text = document.createElement("span");
    text.textContent = label;
    row.append(swatch, text);
    parent.append(row);
    return row;
  }

  function drawLegend() {
    const lg = state.legend, box = $("legend");
    box.replaceChildren();
    const title = document.createElement("h2");
    const shownModel = shownProperty(state.shownLevel) !== state.value;
    const kind = !state.hasModel ? "" : (shownModel ? ", model-based" : ", direct");
    title.textContent = state.value + kind + " (published value)";
    box.append(title);
    if (state.levels.length > 1 || state.hasModel) box.append(levelNote());
    lg.classes.forEach((c) => swatchRow(box, c.colour, c.label).dataset.colour = c.colour);
    drawMarks(box, shownModel);
    drawEstimands(box);
  }

  // The unreleased statuses the shown level has: a tract's from its tiles' tilestats (both
  // where they do not say), a county's or state's both.
  function unreleasedStatuses() {
    const all = ["suppressed", "failed"];
    if (state.shownLevel !== "tract" || !state.statuses.length) return all;
    return all.filter((s) => state.statuses.includes(s));
  }

  // What the map marks beyond the classes, for the shown mode: the units without a value,
  // the low-reliability hatch (an interval spanning classes), and in model mode the tracts
  // coloured by a model value without a direct (dotted) and the flagged ones (outlined).
  function drawMarks(box, shownModel) {
    const lg = state.legend, statuses = unreleasedStatuses();
    const other = document.createElement("h2");
    other.textContent = LEVELS[state.shownLevel].plural + " without a value";
    box.append(other);
    for (const status of statuses) {
      const label = lg.status[status].label + (shownModel ? "; no model value either" : "");
      swatchRow(box, lg.status[status].colour, label).dataset.status = status;
    }
    // direct values have intervals where the release drew them; model values always
    const intervalLevel = shownModel ? 0.95 : state.level;
    if (!intervalLevel && !shownModel) return;
    const marks = document.createElement("h2");
    marks.textContent = "Marked";
    box.append(marks);
    if (intervalLevel) {
      swatchRow(box, null, lg.low_reliability.label + " (" + Math.round(intervalLevel * 100)
                + "% interval; " + (shownModel ? "model-based" : "direct") + ")",
                "hatch").dataset.status = "low-reliability";
    }
    if (shownModel && statuses.length) {
      swatchRow(box, null, lg.model_only.label, "dots").dataset.status = "model-only";
    }
    if (shownModel) {
      const row = swatchRow(box, null, estimandText("model_flag") + " (|" + state.value
                            + "_model_z| > " + estimandText("model_z_limit") + ")", "outline");
      row.querySelector(".swatch").style.borderColor = lg.model_flag.colour;
      row.dataset.status = "model-flag";
    }
  }

  // Which level is drawn and why, and which estimate: the legend says which is which.
  function levelNote() {
    const note = document.createElement("p");
    note.id = "level-note";
    note.className = "estimand";
    const level = state.shownLevel, plural = LEVELS[level].plural.toLowerCase();
    let text = "Shown: " + plural + (state.fixedLevel ? " (chosen)" : " (by zoom: states below "
      + "z5, counties below z8, tracts from z8, among the release's levels)") + ". ";
    if (level !== "tract") {
      text += "Each " + level + "'s own direct DP estimate, from its pooled records.";
    } else if (state.estimate === "model") {
      text += "Model-based: a small-area model fitted to the published values only "
        + "(post-processing); it borrows strength from neighbours and counties, so it is "
        + "steadier than the direct value but shrinks unusual tracts.";
    } else {
      text += "Direct: each tract's own DP estimate.";
    }
    note.textContent = text;
    return note;
  }

  // The one estimand's wording (legend.json), a county's or state's said of its own records.
  function estimandText(key, level) {
    const text = String((state.legend.estimand || {})[key] || "see the manifest (estimand)");
    return level && level !== "tract" ? text.split("tract").join(level) : text;
  }

  // What the shown value and its ± and interval estimate: the one estimand, for every value.
  function drawEstimands(box) {
    const heading = document.createElement("h2");
    heading.textContent = "What " + state.value + " and its ± estimate";
    box.append(heading);
    const level = state.shownLevel;
    const lines = [["definition", estimandText("definition", level) + "; " + state.value
                    + " at parent rank " + (state.value === "p25" ? "25" : "75") + "."]];
    if (state.hasModel) lines.push(["same", estimandText("same", level)]);
    // The ± and the interval of what is shown: the model's (95%, from its root mean squared
    // error; no ±) in model mode, the direct estimators' otherwise.
    const model = shownProperty(level) !== state.value;
    lines.push(["plus-minus", estimandText(model ? "plus_minus_model" : "plus_minus", level)],
               ["interval", estimandText("interval", level) + " "
                + (model ? estimandText("interval_model")
                   : estimandText("interval_direct", level).replace(
                     "{level}", state.level ? Math.round(state.level * 100) + "%" : "stated"))]);
    if (state.hasModel && level === "tract") {
      lines.push(["model-flag", "Marked “" + estimandText("model_flag") + "” where |"
                  + state.value + "_model_z| > " + estimandText("model_z_limit") + "."]);
    }
    for (const [key, line] of lines) {
      const text = document.createElement("p");
      text.className = "estimand";
      text.dataset.estimand = key;
      text.textContent = line;
      box.append(text);
    }
  }

  // -------------------------------------------------------------------------------- popup

  function cell(text) {
    return text === undefined || text === null || text === "" ? "not published" : String(text);
  }

  // A budget to 6 significant digits: the levels' shares sum in floating point (0.7 + 0.2 +
  // 0.1 is 0.9999999999999999), which the popup would otherwise show as "0.99999999".
  function budgetText(value) {
    if (value === undefined || value === null || value === "") return cell(value);
    return String(parseFloat(Number(value).toPrecision(6)));
  }

  // A value with its uncertainty, every ± and interval labelled with what it is:
  // "0.41 ± 0.03 (90% margin of error); 95% interval [0.38, 0.44]". The ± is the 90% margin
  // of error (name_moe90) where published, never a bare standard error; without one, the
  // interval alone. Tiles omit a property where it is null.
  function estimateText(p, name) {
    let text = cell(p[name]);
    const present = (k) => p[k] !== undefined && p[k] !== null && p[k] !== "";
    if (present(name + "_moe90")) text += " ± " + p[name + "_moe90"] + " (90% margin of error)";
    if (present(name + "_lo") && present(name + "_hi")) {
      // The model's intervals are 95%; the direct ones at the release's level.
      const level = name.endsWith("_model") || !state.level ? 0.95 : state.level;
      text += (present(name + "_moe90") ? "; " : ", ") + Math.round(level * 100)
        + "% interval [" + p[name + "_lo"] + ", " + p[name + "_hi"] + "]";
    }
    return text;
  }

  // Where the direct value differs from the model beyond their combined noise
  // (|name_model_z| above the legend's limit), the model may not apply to the unit.
  function modelFlag(p, value) {
    const z = p[value + "_model_z"];
    if (z === undefined || z === null || z === "") return null;
    const limit = Number(estimandText("model_z_limit"));
    return Math.abs(Number(z)) > limit ? estimandText("model_flag") + " (z = " + z + ")" : null;
  }

  // Rows for p25 and p75 of a unit; a tract with model values gets both, each marked.
  function valueRows(p, level) {
    const rows = [], model = level === "tract" && state.hasModel;
    for (const v of ["p25", "p75"]) {
      const shown = v === state.value ? " (shown)" : "";
      if (model) {
        rows.push([v + " model-based" + (state.estimate === "model" ? shown : ""),
                   estimateText(p, v + "_model")]);
        const flag = modelFlag(p, v);
        if (flag) rows.push([v + " model check", flag]);
        rows.push([v + " direct" + (state.estimate === "direct" ? shown : ""),
                   estimateText(p, v)]);
      } else {
        rows.push([v + shown, estimateText(p, v)]);
      }
    }
    return rows;
  }

  // The units above (a tract's county and state, a county's state): each named (its `name`
  // where published) and its estimate of the shown value, the level's own direct estimate,
  // from the level's CSV.
  function unitRows(p, level, units) {
    const rows = [];
    for (const above of ["county", "state"]) {
      const table = units[above];
      if (!table || above === level || level === "state") continue;
      const geoid = above === "county" ? p.county : p.state;
      const row = table.get(geoid + "|" + (p.cell === undefined ? "all" : p.cell));
      const text = row ? estimateText(row, state.value) + (row.status === "released" ? ""
        : " (" + row.status + ")") : "not published";
      if (row && row.name) rows.push([LEVELS[above].noun, geoid + " " + row.name]);
      rows.push([above + " " + geoid + " (" + state.value + ")", text]);
    }
    return rows;
  }

  function popupTable(p, level, units) {
    const rows = [[LEVELS[level].noun, p.geoid + (p.name ? " " + p.name : "")],
                  ["Status", p.status + (p.reason ? ": " + p.reason : "")]];
    rows.push(...valueRows(p, level), ...unitRows(p, level, units || {}));
    rows.push(["n", cell(p.n)], ["Mechanism", cell(p.mechanism)],
              ["Estimand", estimandText("id", level) + (level === "tract" && state.hasModel
                ? " (direct and model-based alike)" : "")],
              ["Budget spent", "ε = " + budgetText(p.epsilon_spent) + ", δ = " +
               budgetText(p.delta_spent)]);
    if (p.cell !== undefined && p.cell !== "all") rows.splice(1, 0, ["Cell", p.cell]);
    const table = document.createElement("table");
    table.className = "tract-popup";
    table.dataset.level = level;
    for (const [k, v] of rows) {
      const tr = table.insertRow();
      const th = document.createElement("th");
      th.textContent = k;
      const td = tr.insertCell();
      tr.prepend(th);
      td.textContent = v;
    }
    if (state.level && p.p25_lo !== undefined) {
      const caption = table.createCaption();
      caption.textContent = "Margins of error and intervals: for the " + estimandText("id", level)
        + ", covering sampling error and privacy noise (DP)";
    }
    return table;
  }

  // The open popup and what it shows, so that a switch redraws it (p25/p75, model/direct) and
  // a cell, level or zoom that no longer draws its unit closes it.
  function openPopup(map, lngLat, props, level) {
    closePopup();
    return unitTables().then((units) => {
      const popup = new maplibregl.Popup({ maxWidth: "min(400px, 92vw)" }).setLngLat(lngLat)
        .setDOMContent(popupTable(props, level, units)).addTo(map);
      const open = { popup: popup, props: props, level: level, units: units };
      state.popup = open;
      popup.on("close", () => { if (state.popup === open) state.popup = null; });
    });
  }

  function closePopup() {
    const open = state.popup;
    state.popup = null;
    if (open) open.popup.remove();
  }

  function refreshPopup() {
    const open = state.popup;
    if (!open) return;
    if (open.props.cell !== undefined && state.cell !== null && open.props.cell !== state.cell) {
      closePopup();
    } else {
      open.popup.setDOMContent(popupTable(open.props, open.level, open.units));
    }
  }

  // ---------------------------------------------------------------------------- downloads

  const DOWNLOADS = [["csv", "CSV"], ["parquet", "GeoParquet"], ["geojson", "GeoJSON"],
                     ["schema.json", "CSV schema"]];

  // The static maps a release may publish beside p25_map.png (the manifest's files say which):
  // p25_map_direct.png, the direct values, when p25_map.png shows the model's
  // (dpatlas/publication/static_map.py).
  const MORE_MAPS = [["p25_map_direct.png", "PNG map (direct values)"]];

  // The release's files, each level's (tracts.csv, counties.parquet, ...), its manifest and
  // its static maps, as links relative to the page.
  function drawDownloads(id, manifest) {
    const box = $("downloads");
    const link = (file, text) => {
      const a = document.createElement("a");
      a.href = releaseHref(id, file);
      a.textContent = text;
      a.dataset.file = file;
      return a;
    };
    const heading = document.createElement("h2");
    heading.textContent = "Download release " + id;
    box.replaceChildren(heading);
    for (const level of state.levels) {
      if (level === "tract" && state.tractParts) {  // a release of several states
        box.append(stateDownloads(manifest, link));
        continue;
      }
      const row = document.createElement("p");
      row.append(LEVELS[level].plural + ": ");
      DOWNLOADS.forEach(([ext, text], i) => {
        if (i) row.append(" · ");
        row.append(link(LEVELS[level].layer + "." + ext, text));
      });
      box.append(row);
    }
    const more = document.createElement("p");
    more.append(link("README.md", "README (codebook: columns, how to read and cite)"), " · ",
                link("manifest.json", "manifest (files, hashes, budget)"), " · ",
                link("p25_map.png", "PNG map"));
    const files = (manifest && manifest.files) || {};
    for (const [file, text] of MORE_MAPS) {
      if (Object.prototype.hasOwnProperty.call(files, file)) more.append(" · ", link(file, text));
    }
    box.append(more);
  }

  // The tract files of a release of several states: a file per state and format (a large
  // state's GeoParquet may be several, part-0, part-1 ...), as the manifest lists them, in a
  // list folded under one line, and the one CSV schema.
  function stateDownloads(manifest, link) {
    const files = Object.keys((manifest && manifest.files) || {}), byState = {};
    const kinds = [[/^tracts-csv\/state=(\d{2})\/tracts\.csv$/, "CSV"],
                   [/^tracts\/state=(\d{2})\/part-(\d+)\.parquet$/, "GeoParquet"],
                   [/^tracts-geojson\/state=(\d{2})\/tracts\.geojson$/, "GeoJSON"]];
    for (const [pattern, text] of kinds) {
      const named = files.map((f) => [f, pattern.exec(f)]).filter(([, m]) => m)
        .sort((a, b) => Number(a[1][2] || 0) - Number(b[1][2] || 0));
      for (const [file, m] of named) {
        (byState[m[1]] = byState[m[1]] || []).push(link(file, m[2] && named.some(
          ([, o]) => o[1] === m[1] && o[2] !== "0") ? text + " (part " + m[2] + ")" : text));
      }
    }
    const details = document.createElement("details");
    const summary = document.createElement("summary");
    const states = Object.keys(byState).sort();
    summary.append("Tracts: a file per state (" + states.length + " states) · ",
                   link("tracts.schema.json", "CSV schema"));
    details.append(summary);
    for (const fips of states) {
      const row = document.createElement("p");
      row.dataset.state = fips;
      const named = (config.states || {})[fips];
      row.append((named ? named[1] : "State " + fips) + ": ");
      byState[fips].forEach((a, i) => { if (i) row.append(" · "); row.append(a); });
      details.append(row);
    }
    return details;
  }

  // ------------------------------------------------------------------------------- search

  // The tract GeoJSON of each state of a release of several states ({state: file}, from the
  // manifest's files), or null (a release of one state publishes tracts.geojson).
  function tractParts(manifest) {
    const out = {};
    for (const file of Object.keys((manifest && manifest.files) || {})) {
      const m = /^tracts-geojson\/state=(\d{2})\/tracts\.geojson$/.exec(file);
      if (m) out[m[1]] = file;
    }
    return Object.keys(out).length ? out : null;
  }

  // A level's published GeoJSON, fetched once per release, when a search first needs it; a
  // release of several states: the tracts of ``states`` only (a search that names no state
  // reads every state's file).
  function levelFeatures(id, level, states) {
    if (level === "tract" && state.tractParts) {
      const parts = state.tractParts;
      const wanted = (states && states.length ? states : Object.keys(parts))
        .filter((s) => parts[s]);
      return Promise.all(wanted.map((s) => {
        const key = id + "|tract|" + s;
        if (!state.geojson[key]) {
          state.geojson[key] = fetchJson(releaseUrl(id, parts[s]))
            .then((doc) => doc.features || []);
        }
        return state.geojson[key];
      })).then((lists) => lists.flat());
    }
    const key = id + "|" + level;
    if (!state.geojson[key]) {
      state.geojson[key] = fetchJson(releaseUrl(id, LEVELS[level].layer + ".geojson"))
        .then((doc) => doc.features || []);
    }
    return state.geojson[key];
  }

  // Properties as the tiles carry them: a value not published (JSON null) is absent.
  function publishedProperties(props) {
    return Object.fromEntries(Object.entries(props).filter(([, v]) => v !== null));
  }

  function outerRings(geometry) {
    if (geometry.type === "Polygon") return [geometry.coordinates[0]];
    if (geometry.type === "MultiPolygon") return geometry.coordinates.map((p) => p[0]);
    return [];
  }

  function ringsBounds(rings) {
    let w = Infinity, s = Infinity, e = -Infinity, n = -Infinity;
    for (const ring of rings) {
      for (const [x, y] of ring) {
        w = Math.min(w, x); e = Math.max(e, x); s = Math.min(s, y); n = Math.max(n, y);
      }
    }
    return [[w, s], [e, n]];
  }

  // A point inside a unit, for its popup: the middle of the first stretch of the largest
  // ring's inside along the line of latitude through that ring's middle.
  function insidePoint(geometry) {
    const rings = outerRings(geometry);
    let ring = rings[0], widest = -1;
    for (const r of rings) {
      const [[w, s], [e, n]] = ringsBounds([r]);
      if ((e - w) * (n - s) > widest) { widest = (e - w) * (n - s); ring = r; }
    }
    const [[w, s], [e, n]] = ringsBounds([ring]), y = (s + n) / 2, xs = [];
    for (let i = 0; i + 1 < ring.length; i++) {
      const [x1, y1] = ring[i], [x2, y2] = ring[i + 1];
      if ((y1 <= y) !== (y2 <= y)) xs.push(x1 + (y - y1) * (x2 - x1) / (y2 - y1));
    }
    xs.sort((a, b) => a - b);
    return xs.length >= 2 ? [(xs[0] + xs[1]) / 2, y] : [(w + e) / 2, y];
  }

  // The zooms at which a level is drawn: from its tiles' minimum zoom, and under "by zoom"
  // only where levelToShow picks it.
  function zoomRange(level) {
    const min = state.minZoom[level] || 0;
    let lo = null, hi = null;
    for (let z = 0; z <= 22; z += 0.1) {
      if (z + 1e-9 < min || levelToShow(z) !== level) continue;
      if (lo === null) lo = z;
      hi = z;
    }
    return lo === null ? [min, 22] : [lo, hi];
  }

  function flyTo(map, bounds, level) {
    const camera = map.cameraForBounds(bounds, { padding: 40 });
    const [lo, hi] = zoomRange(level);
    const zoom = Math.min(Math.max(camera.zoom, lo), hi);
    return new Promise((resolve) => {
      map.once("moveend", resolve);
      map.flyTo({ center: camera.center, zoom: zoom, duration: 700, essential: true });
    });
  }

  // ----------------------------------------------------------- search: what a query matches
  // A query names a unit by its GEOID (tract 11 digits, county 5, state 2), its Census GEO_ID
  // ("1400000US" + a tract GEOID, "0500000US" + county, "0400000US" + state), a state's name
  // or postal code, a county's name with or without "County" and a state (", NC", ", North
  // Carolina"), or a tract's name ("Census Tract 12.01", then its county and/or state after a
  // comma or semicolon to tell it from the tracts of that number elsewhere); any case. The names are the published `name` columns (Census-style); the
  // states' names and postal codes are the page's config (dpatlas/core/state_fips.py).
  const GEO_ID_LEVELS = { "1400000us": "tract", "0500000us": "county", "0400000us": "state" };
  const GEOID_LENGTH = { tract: 11, county: 5, state: 2 };

  // The FIPS code of the state a text names by its name or postal code, any case; or null.
  function stateNamed(text) {
    const low = text.trim().toLowerCase();
    for (const [fips, [postal, name]] of Object.entries(config.states || {})) {
      if (low === postal.toLowerCase() || low === name.toLowerCase()) return fips;
    }
    return null;
  }

  // A county's name as typed or published, for comparing: its base name in lower case
  // ("Wake County, North Carolina", "wake county, NC" and "Wake" are all "wake") and the
  // state a trailing ", North Carolina" or ", NC" names (null where none does).
  function countyKey(text) {
    let base = text.trim().toLowerCase().replace(/\s+/g, " ");
    const comma = base.lastIndexOf(",");
    const fips = comma >= 0 ? stateNamed(base.slice(comma + 1)) : null;
    if (fips !== null) base = base.slice(0, comma).trim();
    return { base: base.replace(/ county$/, ""), state: fips };
  }

  // The county name in a unit's properties: a county's `name`, or the county part of a
  // tract's ("Census Tract 12; Wake County; North Carolina").
  function countyNameOf(p, level) {
    if (typeof p.name !== "string" || !p.name) return null;
    if (level === "county") return p.name;
    const parts = p.name.split("; ");
    return parts.length === 3 ? parts[1] : null;
  }

  // Tests of a unit's properties against a county name: the same name (`test`), else names
  // that start with it (`near`: "Meck", "Mc"); in the state named, if one is.
  function countyNameTests(query, level) {
    const want = countyKey(query);
    const match = (p, same) => {
      const name = countyNameOf(p, level);
      if (name === null || !want.base) return false;
      const have = countyKey(name);
      if (want.state !== null && (have.state || p.state) !== want.state) return false;
      return same ? have.base === want.base : have.base.startsWith(want.base);
    };
    return { test: (p) => match(p, true), near: (p) => match(p, false) };
  }

  // A tract's name as typed or published: its number without leading zeros ("census tract
  // 0012.01" is "12.01"), the county base name after it (countyKey) and the state a last part
  // names; null for a text that is not a tract's name.
  const TRACT_NAME = /^(?:census\s+)?tract\s+0*(\d+(?:\.\d+)?)\s*(?:[,;]\s*(.*))?$/;

  function tractKey(text) {
    const match = TRACT_NAME.exec(text.trim().toLowerCase().replace(/\s+/g, " "));
    if (!match) return null;
    const parts = (match[2] || "").split(/\s*[,;]\s*/).filter((part) => part);
    const fips = parts.length ? stateNamed(parts[parts.length - 1]) : null;
    if (fips !== null) parts.pop();
    const county = parts.length ? countyKey(parts.join(", ")).base : null;
    return { number: match[1], county: county, state: fips };
  }

  // The tracts a tract name names: the same number, in the county and state typed (if any).
  function tractNameTarget(query) {
    const want = tractKey(query);
    if (want === null) return null;
    const test = (p) => {
      const have = typeof p.name === "string" ? tractKey(p.name) : null;
      if (have === null || have.number !== want.number) return false;
      if (want.state !== null && (have.state || p.state) !== want.state) return false;
      if (want.county === null) return true;
      const county = countyNameOf(p, "tract");
      return county !== null && countyKey(county).base === want.county;
    };
    return { level: "tract", what: "tract named “" + query + "”", test: test,
             states: want.state !== null ? [want.state] : null };
  }

  // The unit of ``level`` with this GEOID; a county or state in a release without its files:
  // its tracts (``all``: the level whose files are missing).
  function unitTarget(level, geoid, what) {
    what = what || level + " " + geoid;
    const states = [geoid.slice(0, 2)];  // a release of several states: its state's tracts
    if (level === "tract" || state.levels.includes(level)) {
      return { level: level, what: what, test: (p) => p.geoid === geoid, states: states };
    }
    return { level: "tract", what: what, all: level, test: (p) => p[level] === geoid,
             states: states };
  }

  function searchTarget(query) {
    const low = query.toLowerCase();
    const geoId = /^(1400000us|0500000us|0400000us)(\d+)$/.exec(low);
    if (geoId) {
      const level = GEO_ID_LEVELS[geoId[1]];
      return geoId[2].length === GEOID_LENGTH[level] ? unitTarget(level, geoId[2]) : null;
    }
    for (const level of ["tract", "county", "state"]) {
      if (new RegExp("^\\d{" + GEOID_LENGTH[level] + "}$").test(query)) {
        return unitTarget(level, query);
      }
    }
    if (!/[a-z]/.test(low)) return null;
    const tract = tractNameTarget(query);
    if (tract) return tract;
    const fips = stateNamed(query);
    if (fips !== null) return unitTarget("state", fips, "state " + config.states[fips][1]);
    const level = state.levels.includes("county") ? "county" : "tract";
    return { level: level, what: "county named “" + query + "”",
             all: level === "tract" && "county", ...countyNameTests(query, level) };
  }

  // Suggestions as you type: the release's published county and state names, from the level
  // CSVs the popups read (fetched once per release, when the search box is first used).
  async function fillSuggestions() {
    const list = $("search-names"), id = state.release;
    if (!list || list.dataset.release === id) return;
    list.dataset.release = id;
    const names = new Set();
    for (const table of Object.values(await unitTables())) {
      for (const row of (table ? table.values() : [])) if (row.name) names.add(row.name);
    }
    if (state.release !== id) return;
    list.replaceChildren(...[...names].sort().map((name) => {
      const option = document.createElement("option");
      option.value = name;
      return option;
    }));
  }

  function say(text, found) {
    const box = $("search-message");
    box.textContent = text;
    box.dataset.found = String(found);
    box.hidden = false;
  }

  async function search(map, query) {
    const q = query.trim(), target = searchTarget(q);
    if (!target) {
      closePopup();  // a miss: the old popup would read as the answer
      say("Type an 11-digit tract GEOID (or 1400000US and the GEOID), a tract name (Census "
          + "Tract 12.01, Wake County), a 5-digit county FIPS code, a county name or a state "
          + "name or postal code.", false);
      return;
    }
    const features = await levelFeatures(state.release, target.level, target.states);
    const shown = (f) => f.geometry && (state.cell === null || f.properties.cell === undefined
                                        || f.properties.cell === state.cell);
    let hits = features.filter((f) => shown(f) && target.test(f.properties));
    if (!hits.length && target.near) {
      hits = features.filter((f) => shown(f) && target.near(f.properties));
    }
    if (!hits.length) {
      closePopup();
      say("Not found: no " + target.what + " in release " + state.release + ".", false);
      return;
    }
    if (state.fixedLevel && state.fixedLevel !== target.level) {
      state.fixedLevel = target.level;
      chooseLevelSwitch();
    }
    const bounds = ringsBounds(hits.flatMap((f) => outerRings(f.geometry)));
    if (narrow()) setPanel(false);
    await flyTo(map, bounds, target.level);
    showLevel(map);
    if (target.all) {
      closePopup();
      say("This release has no " + target.all + " files: "
          + "showing the " + hits.length + " tracts of "
          + target.what + ".", true);
      return;
    }
    const props = publishedProperties(hits[0].properties);
    await openPopup(map, insidePoint(hits[0].geometry), props, target.level);
    say("Found " + target.what + (hits.length > 1 ? " (" + hits.length + " matches; the "
        + "first, " + props.geoid + ", shown)" : "") + ".", true);
  }

  // ------------------------------------------------------------------------ the side panel

  const narrow = () => window.matchMedia("(max-width: 640px)").matches;

  // The panel folds away (a phone's screen is the map's); the map takes the room it leaves.
  function setPanel(open) {
    document.body.classList.toggle("panel-closed", !open);
    $("panel-open").setAttribute("aria-expanded", String(open));
    $("panel-close").setAttribute("aria-expanded", String(open));
    if (api.map) api.map.resize();
  }

  // ----------------------------------------------------------------------------- releases

  // feed.json is JSON Feed 1.1: each item's "_dpatlas" is the release's entry (release_id,
  // status, published, title...), the feed's holds latest. A feed of the format before it
  // (releases, latest at the top) reads as it is. Synthetic-microdata folders are not offered.
  function feedReleases(feed) {
    if (!Array.isArray(feed.items)) return { releases: feed.releases || [], latest: feed.latest };
    const releases = feed.items.map((item) => item && item._dpatlas)
      .filter((r) => r && typeof r.release_id === "string" && !r.kind);
    return { releases, latest: (feed._dpatlas || {}).latest };
  }

  // A release as a reader knows it: its title (publish.title) and day, then its id.
  function releaseLabel(r) {
    const day = typeof r.published === "string" ? r.published.slice(0, 10) : "";
    if (!r.title) return day ? r.release_id + ", " + day : r.release_id;
    return r.title + (day ? ", " + day : "") + " (" + r.release_id + ")";
  }

  function fillPicker(releases, latest) {
    const select = $("release");
    select.replaceChildren();
    for (const r of releases) {
      const option = document.createElement("option");
      option.value = r.release_id;
      let text = releaseLabel(r);
      if (r.release_id === latest) text += " (latest)";
      if (r.status === "withdrawn") {
        text += " (withdrawn)";
        option.className = "withdrawn";
        option.dataset.withdrawn = "true";
      }
      option.textContent = text;
      select.append(option);
    }
  }

  function showWithdrawal(id) {
    const r = state.releases.find((x) => x.release_id === id);
    const box = $("withdrawn");
    if (r && r.status === "withdrawn") {
      box.textContent = "This release was withdrawn" + (r.withdrawn_at ? " on " + r.withdrawn_at : "")
        + (r.withdrawn_reason ? ": " + r.withdrawn_reason : "") + ". Its values should not be used.";
      box.hidden = false;
    } else {
      box.hidden = true;
    }
  }

  // A level's CSV (counties.csv, states.csv) as a map "geoid|cell" -> row, numbers as the
  // tiles show them; RFC 4180 (quoted fields may hold commas, quotes and newlines).
  function parseCsv(text) {
    const records = [];
    let row = [], field = "", quoted = false;
    for (let i = 0; i < text.length; i++) {
      const c = text[i];
      if (quoted) {
        if (c === '"' && text[i + 1] === '"') { field += '"'; i++; }
        else if (c === '"') quoted = false;
        else field += c;
      } else if (c === '"') quoted = true;
      else if (c === ",") { row.push(field); field = ""; }
      else if (c === "\n" || c === "\r") {
        if (c === "\r" && text[i + 1] === "\n") i++;
        row.push(field); records.push(row); row = []; field = "";
      } else field += c;
    }
    if (field !== "" || row.length) { row.push(field); records.push(row); }
    return records;
  }

  async function unitTable(id, level) {
    const response = await fetch(releaseUrl(id, LEVELS[level].layer + ".csv"));
    if (!response.ok) throw new Error(LEVELS[level].layer + ".csv: HTTP " + response.status);
    const text = await response.text();
    const [header, ...rows] = parseCsv(text);
    const table = new Map();
    for (const values of rows) {
      const row = {};
      header.forEach((name, i) => {
        const v = values[i];
        row[name] = v !== "" && name !== "geoid" && !isNaN(Number(v)) ? Number(v) : v;
      });
      table.set(row.geoid + "|" + row.cell, row);
    }
    return table;
  }

  // The county and state tables of the open release, fetched once, when a popup needs them.
  async function unitTables() {
    const id = state.release, out = {};
    for (const level of ["county", "state"]) {
      if (!state.levels.includes(level)) continue;
      const key = id + "|" + level;
      if (!state.unitTables[key]) state.unitTables[key] = unitTable(id, level);
      out[level] = await state.unitTables[key].catch(() => null);
    }
    return out;
  }

  // The values of a string attribute of the tracts layer, from the tiles' tilestats.
  function attributeValues(metadata, name) {
    const layers = (metadata && metadata.tilestats && metadata.tilestats.layers) || [];
    const layer = layers.find((l) => l.layer === LAYER) || {};
    const attr = (layer.attributes || []).find((a) => a.attribute === name);
    return (attr && attr.values) || [];
  }

  // A release of several cells published between issues 35's first and last step has a
  // tract archive per cell (manifest.json's cell_tiles): the tract source is the shown
  // cell's archive. Otherwise it is tracts.pmtiles: the polygons alone (values apart, above)
  // or, from before issue 35, every cell's features filtered by cell.
  function cellArchives(manifest) {
    const files = manifest && manifest.cell_tiles;
    return files && typeof files === "object" && Object.keys(files).length ? files : null;
  }

  // The values a tract attribute (status, mechanism) takes in the release. With an archive
  // per cell the shown archive's tilestats know its own cell alone: the manifest's counts
  // (counts.by_status, counts.by_mechanism) are every cell's. Otherwise the tiles' tilestats.
  function tractValues(manifest, metadata, name) {
    const counts = manifest && manifest.counts && manifest.counts["by_" + name];
    if ((state.cellTiles || state.tractValues) && counts && typeof counts === "object") {
      return Object.keys(counts);
    }
    return attributeValues(metadata, name);
  }

  // ------------------------------------------------ tract values published apart (by state)

  // The manifest's tract_values (the documents' columns, each cell's folder) and the
  // documents it lists (tract-values/<cell>/<state>.json), or nulls for a release that tiles
  // values with polygons.
  function valuesOf(manifest) {
    const entry = manifest && manifest.tract_values;
    const folders = entry && entry.folders;
    if (!folders || typeof folders !== "object" || !Object.keys(folders).length) {
      return [null, null, []];
    }
    const files = new Set(Object.keys(manifest.files || {})
      .filter((f) => f.startsWith("tract-values/")));
    return [folders, files, (entry.columns || []).map(String)];
  }

  // One cell's values of one state's tracts, fetched once per release: {geoid: properties},
  // each row's values by column, without the nulls (a value not published is absent, as
  // tiles omit it), with the document's cell and state.
  function stateValues(id, cell, fips) {
    const file = state.tractValues[cell] + "/" + fips + ".json";
    if (!state.valueFiles.has(file)) return Promise.resolve(new Map());
    const key = id + "|" + file;
    if (!state.valueDocs[key]) {
      state.valueDocs[key] = fetchJson(releaseUrl(id, file)).then((doc) => {
        const rows = new Map(), columns = doc.columns || [];
        for (const row of doc.rows || []) {
          const props = { cell: doc.cell, state: doc.state };
          columns.forEach((c, i) => { if (row[i] !== null) props[c] = row[i]; });
          rows.set(String(props.geoid), props);
        }
        return rows;
      });
      state.valueDocs[key].catch(() => { delete state.valueDocs[key]; });
    }
    return state.valueDocs[key];
  }

  // The shown cell's values of the tracts in the loaded tiles, set as their feature states,
  // a state's document at a time as each comes into view (the first time only).
  function applyValues(map) {
    if (!state.tractValues || !map.getSource(LAYER)) return;
    const id = state.release, cell = state.cell, states = new Set();
    for (const f of map.querySourceFeatures(LAYER, { sourceLayer: LAYER })) {
      states.add(String(f.properties.geoid).slice(0, 2));
    }
    for (const fips of states) {
      const key = id + "|" + cell + "|" + fips;
      if (state.applied.has(key)) continue;
      state.applied.add(key);
      state.pendingValues += 1;
      stateValues(id, cell, fips).then((rows) => {
        if (state.release !== id || state.cell !== cell) return;
        for (const [geoid, props] of rows) {
          map.setFeatureState({ source: LAYER, sourceLayer: LAYER, id: geoid }, props);
        }
      }).catch((err) => {
        state.applied.delete(key);
        showError("the values of state " + fips + " did not load: " + String(err));
      }).finally(() => { state.pendingValues -= 1; });
    }
  }

  // The shown cell changed: every tract's state is the new cell's, fetched as it is needed.
  function resetValues(map) {
    if (!state.tractValues || !map.getSource(LAYER)) return;
    map.removeFeatureState({ source: LAYER, sourceLayer: LAYER });
    state.applied = new Set();
    applyValues(map);
  }

  // A tract's properties for its popup: its feature's, or with values apart the shown
  // cell's row of its state's document (fetched if it has not arrived yet).
  async function tractProperties(feature) {
    if (!state.tractValues) return feature.properties;
    const geoid = String(feature.properties.geoid);
    const rows = await stateValues(state.release, state.cell, geoid.slice(0, 2));
    return rows.get(geoid) || { geoid: geoid, status: "not published" };
  }

  function tractArchive(id) {
    const file = state.cellTiles ? state.cellTiles[state.cell] : LEVELS.tract.file;
    const archive = new pmtiles.PMTiles(releaseUrl(id, file));
    protocol.add(archive);
    return archive;
  }

  // A county or state archive: with several cells the shown cell's (manifest.json's
  // level_cell_tiles), else counties.pmtiles / states.pmtiles with every cell's features.
  function levelArchive(id, level) {
    const files = state.levelCellTiles && state.levelCellTiles[level];
    const file = files && files[state.cell] ? files[state.cell] : LEVELS[level].file;
    const archive = new pmtiles.PMTiles(releaseUrl(id, file));
    protocol.add(archive);
    return archive;
  }

  // The shown cell changed: with an archive per cell, each level's source reads the new
  // cell's (the map then fetches that cell's tiles alone).
  function showCellTiles(map) {
    const source = state.cellTiles && map.getSource(LAYER);
    if (source) source.setUrl("pmtiles://" + tractArchive(state.release).source.getKey());
    for (const level of state.levels || []) {
      const levelSource = level !== "tract" && state.levelCellTiles
        && state.levelCellTiles[level] && map.getSource(LEVELS[level].layer);
      if (levelSource) {
        levelSource.setUrl("pmtiles://" + levelArchive(state.release, level).source.getKey());
      }
    }
  }

  function chooseCell(metadata) {
    const cells = state.tractValues ? Object.keys(state.tractValues)
      : state.cellTiles ? Object.keys(state.cellTiles) : attributeValues(metadata, "cell");
    const select = $("cell");
    select.replaceChildren(...cells.map((c) => new Option(c, c)));
    $("cell-row").hidden = cells.length < 2;
    if (cells.length === 0) return null;
    return cells.includes(state.cell) ? state.cell : (cells.includes("all") ? "all" : cells[0]);
  }

  // What the release tells its readers (config.json's publish section): its title, a notice
  // (e.g. that the data are synthetic) above everything, its licence, citation and contact.
  function showReleaseText(id, publish) {
    const title = publish.title || "dpatlas";
    $("title").textContent = title;
    document.title = publish.title ? publish.title + " (dpatlas)" : DEFAULT_TITLE;
    $("notice").textContent = publish.notice || "";
    $("notice").hidden = !publish.notice;
    const about = $("about");
    about.replaceChildren();
    const licence = publish.license || "CC-BY-4.0";
    const named = document.createElement("span");  // an SPDX id; the page links off no site
    named.textContent = licence;
    named.id = "licence";
    about.append("Licence: ", named, ". ");
    const cite = document.createElement("span");
    cite.id = "citation";
    cite.textContent = "Cite as: " + (publish.citation || title + ", release " + id) + ".";
    about.append(cite);
    if (publish.contact) about.append(" Contact: " + publish.contact + ".");
    about.hidden = false;
  }

  async function loadRelease(map, id) {
    state.release = id;
    api.loaded = null;
    const manifest = await fetchJson(releaseUrl(id, "manifest.json")).catch(() => null);
    state.cellTiles = cellArchives(manifest);
    let valueColumns;
    [state.tractValues, state.valueFiles, valueColumns] = valuesOf(manifest);
    state.applied = new Set();
    state.tractParts = tractParts(manifest);
    const levelFiles = manifest && manifest.level_cell_tiles;
    state.levelCellTiles = levelFiles && typeof levelFiles === "object" ? levelFiles : null;
    if (state.cellTiles) state.cell = chooseCell(null);  // the cell whose archive to open
    const archive = tractArchive(id);
    const [header, metadata, releaseConfig] = await Promise.all([
      archive.getHeader(), archive.getMetadata(),
      fetchJson(releaseUrl(id, "config.json")).catch(() => null)]);
    showReleaseText(id, (releaseConfig && releaseConfig.publish) || {});
    const intervals = (releaseConfig && releaseConfig.intervals) || {};
    state.level = intervals.enabled ? intervals.level : null;
    state.cell = chooseCell(metadata);
    state.mechanisms = tractValues(manifest, metadata, "mechanism").map(String).sort();
    state.statuses = tractValues(manifest, metadata, "status").map(String);
    $("cell").value = state.cell;
    // The levels the release published (config.json's levels; absent: tracts only).
    const published = (releaseConfig && releaseConfig.levels) || ["tract"];
    state.levels = ["tract", "county", "state"].filter((l) => published.includes(l));
    chooseLevelSwitch();
    state.hasModel = (state.tractValues ? valueColumns : tractFields(metadata))
      .includes("p25_model");
    chooseEstimateSwitch();
    // Each level's archive, and its minimum zoom (below it the level has no tiles).
    const archives = { tract: archive };
    for (const level of state.levels) {
      if (level === "tract") continue;
      archives[level] = levelArchive(id, level);
    }
    const headers = await Promise.all(state.levels.map((l) => archives[l].getHeader()));
    removeRelease(map);
    state.minZoom = {};
    state.levels.forEach((level, i) => { state.minZoom[level] = headers[i].minZoom; });
    state.bounds = [[header.minLon, header.minLat], [header.maxLon, header.maxLat]];
    map.fitBounds(state.bounds, { padding: 20, animate: false });
    state.shownLevel = levelToShow(map.getZoom());
    for (const level of state.levels) {
      addLayers(map, level, archives[level].source.getKey());
    }
    addOutlines(map);
    drawLegend();
    drawDownloads(id, manifest);
    $("search-message").hidden = true;
    showDataMessage(map);
    $("manifest-link").href = releaseUrl(id, "manifest.json");
    $("release").value = id;
    showWithdrawal(id);
    applyValues(map);
    // Loaded: the map idle with no tract values on their way (each set repaints it). Asked
    // again after a wait, with a repaint, so an idle comes even if the map went idle in it.
    const loaded = () => {
      if (state.release !== id) return;
      if (state.pendingValues > 0) {
        setTimeout(() => { map.once("idle", loaded); map.triggerRepaint(); }, 50);
        return;
      }
      api.loaded = id;
      document.body.dataset.loaded = id;
    };
    map.once("idle", loaded);
  }


  // The attribute names of the tracts layer (tippecanoe's vector_layers fields).
  function tractFields(metadata) {
    const layers = (metadata && metadata.vector_layers) || [];
    const layer = layers.find((l) => l.id === LAYER) || {};
    return Object.keys(layer.fields || {});
  }

  // The level switch shows only when the release has levels beyond the tract.
  function chooseLevelSwitch() {
    $("level-switch").hidden = state.levels.length < 2;
    for (const radio of document.querySelectorAll("input[name=level]")) {
      radio.disabled = radio.value !== "auto" && !state.levels.includes(radio.value);
      radio.checked = radio.value === (state.fixedLevel || "auto");
    }
  }

  // The model/direct switch shows only when the tract tiles carry model-based values; the
  // model-based value is the default then.
  function chooseEstimateSwitch() {
    $("estimate-switch").hidden = !state.hasModel;
    if (!state.hasModel) state.estimate = "direct";
    else if (!$("estimate-switch").dataset.touched) state.estimate = "model";
    for (const radio of document.querySelectorAll("input[name=estimate]")) {
      radio.checked = radio.value === state.estimate;
    }
  }

  function restyle(map) {
    for (const level of state.levels) {
      if (!map.getLayer(layerId(level, "fill"))) continue;
      styleLevel(map, level);
      if (map.getLayer(layerId(level, "outline"))) {
        map.setFilter(layerId(level, "outline"), cellFilter(level));
      }
    }
    drawLegend();
    refreshPopup();
  }

  function requestedRelease(latest) {
    const hash = new URLSearchParams(location.hash.slice(1)).get("release");
    const known = (id) => id && state.releases.some((r) => r.release_id === id);
    if (known(hash)) return hash;
    if (config.release) return config.release;
    if (known(latest)) return latest;
    return state.releases.length ? state.releases[0].release_id : null;
  }

  async function start() {
    state.legend = await fetchJson(absolute(config.assets + "legend.json"));
    let latest = null;
    try {
      const feed = feedReleases(await fetchJson(absolute(config.feed)));
      state.releases = feed.releases;
      latest = feed.latest;
    } catch (err) {
      if (!config.release) throw err;        // the feed's page needs the feed
    }
    if (config.release && !state.releases.some((r) => r.release_id === config.release)) {
      state.releases.unshift({ release_id: config.release, status: "published" });
    }
    fillPicker(state.releases, latest);
    const first = requestedRelease(latest);
    if (!first) { showError("the feed lists no release yet"); return; }

    setPanel(!narrow());
    const map = new maplibregl.Map({
      container: "map",
      style: { version: 8, sources: {},
               layers: [{ id: "background", type: "background",
                          paint: { "background-color": state.legend.background } }] },
      center: [-96, 38], zoom: 3, attributionControl: { compact: true },
    });
    api.map = map;
    // A tile whose range request failed in the network ("Failed to fetch": a dropped
    // connection, or a request the browser cut while the map moved on) is fetched again once
    // per source and release: its source reloads (setUrl with its own URL). Any other map
    // error, and a failure after that retry, is a console error naming the source, tile and
    // cause (MapLibre without a listener logs the bare Error object, whose text may be only
    // "Error"): a tile that failed leaves a hole in the map.
    const retried = new Set();
    map.on("error", (e) => {
      const error = e.error || {}, canonical = e.tile && e.tile.tileID && e.tile.tileID.canonical;
      const source = e.sourceId && map.getSource(e.sourceId);
      const key = state.release + "|" + e.sourceId;
      if (canonical && source && source.url && error.message === "Failed to fetch"
          && !retried.has(key)) {
        retried.add(key);
        console.warn("dpatlas web map: tile " + canonical.z + "/" + canonical.x + "/"
                     + canonical.y + " of source " + e.sourceId + " failed to fetch; reloading "
                     + "the source once");
        source.setUrl(source.url);
        return;
      }
      const where = [e.sourceId ? "source " + e.sourceId : "",
                     canonical ? "tile " + canonical.z + "/" + canonical.x + "/" + canonical.y
                               : "",
                     error.url ? "url " + error.url : "",
                     error.status ? "HTTP " + error.status : ""].filter(Boolean).join(", ");
      console.error("dpatlas web map: map error " + (error.name || "Error") + ": "
                    + (error.message || "(no message)") + (where ? " (" + where + ")" : "")
                    + (error.stack ? "\n" + error.stack : ""));
    });
    map.addControl(new maplibregl.NavigationControl({ showCompass: false }));
    map.addControl(new maplibregl.ScaleControl({ maxWidth: 120, unit: "metric" }),
                   "bottom-left");
    map.getContainer().append($("data-message"));
    await new Promise((resolve) => map.on("load", resolve));
    map.addImage(HATCH, patternImage(state.legend.low_reliability.colour, hatchPixel));
    map.addImage(DOTS, patternImage(state.legend.model_only.colour, dotPixel));
    addContext(map);

    for (const level of Object.keys(LEVELS)) {
      const fill = layerId(level, "fill");
      map.on("click", fill, (e) => {
        const feature = e.features && e.features[0];
        if (!feature) return;
        const props = level === "tract" ? tractProperties(feature)
          : Promise.resolve(feature.properties);
        props.then((p) => openPopup(map, e.lngLat, p, level))
          .catch((err) => showError(String(err)));
      });
      map.on("mouseenter", fill, () => { map.getCanvas().style.cursor = "pointer"; });
      map.on("mouseleave", fill, () => { map.getCanvas().style.cursor = ""; });
    }
    map.on("zoom", () => showLevel(map));
    map.on("sourcedata", (e) => {
      if (e.sourceId === LAYER && e.isSourceLoaded) applyValues(map);
    });
    map.on("moveend", () => showDataMessage(map));
    $("show-all").addEventListener("click", () => {
      if (state.bounds) map.fitBounds(state.bounds, { padding: 20 });
    });
    $("search-box").addEventListener("focus", () => { fillSuggestions().catch(() => {}); });
    $("search").addEventListener("submit", (e) => {
      e.preventDefault();
      search(map, $("search-box").value).catch((err) => say(String(err), false));
    });
    $("panel-open").addEventListener("click", () => setPanel(true));
    $("panel-close").addEventListener("click", () => setPanel(false));

    $("release").addEventListener("change", (e) => {
      history.replaceState(null, "", "#release=" + encodeURIComponent(e.target.value));
      loadRelease(map, e.target.value).catch((err) => showError(String(err)));
    });
    for (const radio of document.querySelectorAll("input[name=value]")) {
      radio.addEventListener("change", (e) => { state.value = e.target.value; restyle(map); });
    }
    $("cell").addEventListener("change", (e) => {
      state.cell = e.target.value;
      showCellTiles(map);
      resetValues(map);
      restyle(map);
    });
    for (const radio of document.querySelectorAll("input[name=level]")) {
      radio.addEventListener("change", (e) => {
        state.fixedLevel = e.target.value === "auto" ? null : e.target.value;
        showLevel(map);
        drawLegend();
      });
    }
    for (const radio of document.querySelectorAll("input[name=estimate]")) {
      radio.addEventListener("change", (e) => {
        state.estimate = e.target.value;
        $("estimate-switch").dataset.touched = "true";
        restyle(map);
      });
    }
    await loadRelease(map, first);
  }

  start().catch((err) => showError(String(err && err.message ? err.message : err)));
})();
