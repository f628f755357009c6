// dpatlas web map: a choropleth of one release's published p25 or p75 per census tract, read
// from the release's PMTiles archive with HTTP range requests. Every URL is relative to the
// page, so it works from any static host that serves ranges, and offline (no CDN, no basemap).
// Colours and classes come from legend.json, written by dpatlas/webmap/__init__.py.
(function () {
  "use strict";

  const config = JSON.parse(document.getElementById("dpatlas-config").textContent);
  const LAYER = "tracts";            // dpatlas.tiles.LAYER
  const SOURCE = "tracts";
  const HATCH = "low-reliability-hatch";
  // The line each mechanism's published rows estimate (mechanisms.intervals.ESTIMANDS; the
  // manifest's intervals.estimand), looked up by a row's mechanism column: the map reads
  // neither the manifest nor STAC, and a rule's row names the mechanism it chose.
  const ESTIMANDS = {
    NoisyStats: "the least-squares line of the tract's observed ranks",
    DPExpTheilSen: "the Theil–Sen (median-type) line of the tract's observed ranks, which "
                   + "differs from the least-squares line when ranks are skewed or censored",
  };
  const OTHER_ESTIMAND = "see the manifest (intervals.estimand)";
  const state = { release: null, value: "p25", cell: null, lowWidth: null, level: null,
                  legend: null, releases: [], mechanisms: [] };
  // For tests and the curious: the map, the state, and the id of the release last drawn.
  const api = (window.dpatlas = { state: state, map: null, loaded: null });

  const protocol = new pmtiles.Protocol();
  maplibregl.addProtocol("pmtiles", protocol.tile);

  const $ = (id) => document.getElementById(id);
  const absolute = (relative) => new URL(relative, document.baseURI).href;

  // A release page shows its own files from its own folder ("./"), so it also works when the
  // folder is served alone; any other release is a sibling folder under releaseBase.
  function releaseUrl(id, file) {
    if (id === config.release) return absolute(file);
    return absolute(config.releaseBase + encodeURIComponent(id) + "/" + file);
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

  function fillColour() {
    const lg = state.legend;
    const steps = ["step", ["to-number", ["get", state.value], 0], lg.classes[0].colour];
    lg.breaks.forEach((b, i) => steps.push(b, lg.classes[i + 1].colour));
    return ["match", ["get", "status"],
            "suppressed", lg.status.suppressed.colour,
            "failed", lg.status.failed.colour,
            steps];
  }

  function cellFilter() {
    return state.cell === null ? true : ["==", ["get", "cell"], state.cell];
  }

  // Low reliability: released, with an interval for the shown value wider than the release's
  // intervals.low_reliability_width (as p25_map.png hatches it). "has" comes first so a tract
  // without bounds is never evaluated.
  function hatchFilter() {
    const lo = state.value + "_lo", hi = state.value + "_hi";
    return ["all", cellFilter(), ["==", ["get", "status"], "released"],
            ["has", lo], ["has", hi],
            [">", ["-", ["get", hi], ["get", lo]], state.lowWidth]];
  }

  function hatchImage(colour) {
    const size = 8, data = new Uint8Array(size * size * 4);
    const rgb = [1, 3, 5].map((i) => parseInt(colour.slice(i, i + 2), 16));
    for (let y = 0; y < size; y++) {
      for (let x = 0; x < size; x++) {
        if ((x + y) % size !== 0) continue;
        const k = (y * size + x) * 4;
        data.set([rgb[0], rgb[1], rgb[2], 255], k);
      }
    }
    return { width: size, height: size, data: data };
  }

  function addLayers(map) {
    map.addLayer({ id: "tracts-fill", type: "fill", source: SOURCE, "source-layer": LAYER,
                   filter: cellFilter(),
                   paint: { "fill-color": fillColour(), "fill-opacity": 1,
                            "fill-antialias": false } });
    if (state.lowWidth !== null) {
      map.addLayer({ id: "tracts-hatch", type: "fill", source: SOURCE, "source-layer": LAYER,
                     filter: hatchFilter(), paint: { "fill-pattern": HATCH } });
    }
    map.addLayer({ id: "tracts-line", type: "line", source: SOURCE, "source-layer": LAYER,
                   filter: cellFilter(),
                   paint: { "line-color": "#ffffff", "line-width": 0.4, "line-opacity": 0.7 } });
  }

  function removeRelease(map) {
    for (const id of ["tracts-line", "tracts-hatch", "tracts-fill"]) {
      if (map.getLayer(id)) map.removeLayer(id);
    }
    if (map.getSource(SOURCE)) map.removeSource(SOURCE);
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
    title.textContent = state.value + " (published value)";
    box.append(title);
    lg.classes.forEach((c) => swatchRow(box, c.colour, c.label).dataset.colour = c.colour);
    const other = document.createElement("h2");
    other.textContent = "Tracts without a value";
    box.append(other);
    for (const status of ["suppressed", "failed"]) {
      swatchRow(box, lg.status[status].colour, lg.status[status].label).dataset.status = status;
    }
    if (state.lowWidth !== null) {
      swatchRow(box, null, lg.low_reliability.label.replace("{width}", String(state.lowWidth))
                + (state.level ? " (" + Math.round(state.level * 100) + "% interval)" : ""),
                "hatch").dataset.status = "low-reliability";
    }
    drawEstimands(box);
  }

  function estimandOf(mechanism) {
    return ESTIMANDS[mechanism] || OTHER_ESTIMAND;
  }

  // Which line the shown value estimates, per mechanism of this release (all known ones when
  // the tiles do not list the mechanisms).
  function drawEstimands(box) {
    const heading = document.createElement("h2");
    heading.textContent = "What " + state.value + " estimates";
    box.append(heading);
    const parentRank = state.value === "p25" ? "25" : "75";
    const names = state.mechanisms.length ? state.mechanisms : Object.keys(ESTIMANDS);
    for (const name of names) {
      const text = document.createElement("p");
      text.className = "estimand";
      text.dataset.mechanism = name;
      text.textContent = name + " rows: " + estimandOf(name) + ", at parent rank " + parentRank;
      box.append(text);
    }
  }

  // -------------------------------------------------------------------------------- popup

  function cell(text) {
    return text === undefined || text === null || text === "" ? "not published" : String(text);
  }

  function popupTable(p) {
    const rows = [["Tract", p.geoid], ["Status", p.status + (p.reason ? ": " + p.reason : "")]];
    for (const v of ["p25", "p75"]) {
      let text = cell(p[v]);
      // The interval-implied standard error (post-processing of the interval), as the
      // Opportunity Atlas shows one beside each estimate; tiles omit it where it is null.
      if (p[v + "_se"] !== undefined && p[v + "_se"] !== null) text += " ± " + p[v + "_se"];
      if (p[v + "_lo"] !== undefined && p[v + "_hi"] !== undefined) {
        text += " [" + p[v + "_lo"] + ", " + p[v + "_hi"] + "]";
      }
      rows.push([v + (v === state.value ? " (shown)" : ""), text]);
    }
    rows.push(["n", cell(p.n)], ["Mechanism", cell(p.mechanism)],
              ["Estimand", p.mechanism ? estimandOf(p.mechanism) : "not published"],
              ["Budget spent", "ε = " + cell(p.epsilon_spent) + ", δ = " + cell(p.delta_spent)]);
    if (p.cell !== undefined && p.cell !== "all") rows.splice(1, 0, ["Cell", p.cell]);
    const table = document.createElement("table");
    table.className = "tract-popup";
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
      caption.textContent = "intervals: " + Math.round(state.level * 100) + "% confidence (DP)";
    }
    return table;
  }

  // ----------------------------------------------------------------------------- releases

  function fillPicker(releases, latest) {
    const select = $("release");
    select.replaceChildren();
    for (const r of releases) {
      const option = document.createElement("option");
      option.value = r.release_id;
      let text = r.release_id;
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

  // The values of a string attribute of the tracts layer, from the tiles' tilestats.
  function attributeValues(metadata, name) {
    const layers = (metadata && metadata.tilestats && metadata.tilestats.layers) || [];
    const layer = layers.find((l) => l.layer === LAYER) || {};
    const attr = (layer.attributes || []).find((a) => a.attribute === name);
    return (attr && attr.values) || [];
  }

  function chooseCell(metadata) {
    const cells = attributeValues(metadata, "cell");
    const select = $("cell");
    select.replaceChildren(...cells.map((c) => new Option(c, c)));
    $("cell-row").hidden = cells.length < 2;
    if (cells.length === 0) return null;
    return cells.includes(state.cell) ? state.cell : (cells.includes("all") ? "all" : cells[0]);
  }

  async function loadRelease(map, id) {
    state.release = id;
    api.loaded = null;
    const url = releaseUrl(id, "tracts.pmtiles");
    const archive = new pmtiles.PMTiles(url);
    protocol.add(archive);
    const [header, metadata, releaseConfig] = await Promise.all([
      archive.getHeader(), archive.getMetadata(),
      fetchJson(releaseUrl(id, "config.json")).catch(() => null)]);
    const intervals = (releaseConfig && releaseConfig.intervals) || {};
    state.lowWidth = intervals.enabled && intervals.low_reliability_width != null
      ? Number(intervals.low_reliability_width) : null;
    state.level = intervals.enabled ? intervals.level : null;
    state.cell = chooseCell(metadata);
    state.mechanisms = attributeValues(metadata, "mechanism").map(String).sort();
    $("cell").value = state.cell;
    removeRelease(map);
    map.addSource(SOURCE, { type: "vector", url: "pmtiles://" + url });
    addLayers(map);
    drawLegend();
    $("manifest-link").href = releaseUrl(id, "manifest.json");
    $("release").value = id;
    showWithdrawal(id);
    map.fitBounds([[header.minLon, header.minLat], [header.maxLon, header.maxLat]],
                  { padding: 20, animate: false });
    map.once("idle", () => {
      if (state.release !== id) return;
      api.loaded = id;
      document.body.dataset.loaded = id;
    });
  }

  function restyle(map) {
    if (!map.getLayer("tracts-fill")) return;
    map.setPaintProperty("tracts-fill", "fill-color", fillColour());
    for (const id of ["tracts-fill", "tracts-line"]) map.setFilter(id, cellFilter());
    if (map.getLayer("tracts-hatch")) map.setFilter("tracts-hatch", hatchFilter());
    drawLegend();
  }

  function requestedRelease(feed) {
    const hash = new URLSearchParams(location.hash.slice(1)).get("release");
    const known = (id) => id && state.releases.some((r) => r.release_id === id);
    if (known(hash)) return hash;
    if (config.release) return config.release;
    if (known(feed && feed.latest)) return feed.latest;
    return state.releases.length ? state.releases[0].release_id : null;
  }

  async function start() {
    state.legend = await fetchJson(absolute(config.assets + "legend.json"));
    let feed = null;
    try {
      feed = await fetchJson(absolute(config.feed));
      state.releases = feed.releases || [];
    } catch (err) {
      if (!config.release) throw err;        // the feed's page needs the feed
    }
    if (config.release && !state.releases.some((r) => r.release_id === config.release)) {
      state.releases.unshift({ release_id: config.release, status: "published" });
    }
    fillPicker(state.releases, feed && feed.latest);
    const first = requestedRelease(feed);
    if (!first) { showError("the feed lists no release yet"); return; }

    const map = new maplibregl.Map({
      container: "map",
      style: { version: 8, sources: {},
               layers: [{ id: "background", type: "background",
                          paint: { "background-color": state.legend.background } }] },
      center: [-96, 38], zoom: 3, attributionControl: { compact: true },
    });
    api.map = map;
    map.addControl(new maplibregl.NavigationControl({ showCompass: false }));
    await new Promise((resolve) => map.on("load", resolve));
    map.addImage(HATCH, hatchImage(state.legend.low_reliability.colour));

    map.on("click", "tracts-fill", (e) => {
      const feature = e.features && e.features[0];
      if (!feature) return;
      new maplibregl.Popup({ maxWidth: "380px" }).setLngLat(e.lngLat)
        .setDOMContent(popupTable(feature.properties)).addTo(map);
    });
    map.on("mouseenter", "tracts-fill", () => { map.getCanvas().style.cursor = "pointer"; });
    map.on("mouseleave", "tracts-fill", () => { map.getCanvas().style.cursor = ""; });

    $("release").addEventListener("change", (e) => {
      history.replaceState(null, "", "#release=" + encodeURIComponent(e.target.value));
      loadRelease(map, e.target.value).catch((err) => showError(String(err)));
    });
    for (const radio of document.querySelectorAll("input[name=value]")) {
      radio.addEventListener("change", (e) => { state.value = e.target.value; restyle(map); });
    }
    $("cell").addEventListener("change", (e) => { state.cell = e.target.value; restyle(map); });
    await loadRelease(map, first);
  }

  start().catch((err) => showError(String(err && err.message ? err.message : err)));
})();
