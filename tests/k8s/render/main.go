// helm-render renders a Helm chart as `helm template` does, for the chart's tests on
// machines without Helm (Helm is in no package registry we reach).
//
// Helm's template engine is Go's text/template with the sprig functions; this program uses
// the same two (Debian's packages) and adds Helm's own few pieces: include, tpl, required,
// toYaml/fromYaml/toJson/fromJson (through sigs.k8s.io/yaml, as Helm does), lookup (always
// empty, as in `helm template`), .Values (the chart's values.yaml coalesced with -f files
// and --set/--set-file, numbers read as float64 as Helm reads them), .Release, .Chart,
// .Capabilities, .Template and .Files (Get, Glob, AsConfig).
//
//	helm-render [--release NAME] [--namespace NS] [-f VALUES]... [--set K=V]...
//	            [--set-file K=PATH]... CHART_DIR
//
// Writes the rendered manifests to stdout, each as "---\n# Source: <template>\n...".
// A template error (`required`, `fail`, a syntax error) is printed and exits 1.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig"
	"sigs.k8s.io/yaml"
)

type chartMetadata struct {
	APIVersion  string   `json:"apiVersion"`
	Name        string   `json:"name"`
	Version     string   `json:"version"`
	AppVersion  string   `json:"appVersion"`
	Description string   `json:"description"`
	Type        string   `json:"type"`
	KubeVersion string   `json:"kubeVersion"`
	Home        string   `json:"home"`
	Keywords    []string `json:"keywords"`
}

type release struct {
	Name      string
	Namespace string
	Service   string
	Revision  int
	IsInstall bool
	IsUpgrade bool
}

type kubeVersion struct{ Version, Major, Minor string }

type versionSet []string

func (v versionSet) Has(apiVersion string) bool {
	for _, x := range v {
		if x == apiVersion {
			return true
		}
	}
	return false
}

type capabilities struct {
	KubeVersion kubeVersion
	APIVersions versionSet
}

// files is the chart's non-template files, as Helm's .Files.
type files map[string][]byte

func (f files) Get(name string) string { return string(f[name]) }

func (f files) Glob(pattern string) files {
	matched := files{}
	for name, content := range f {
		if ok, _ := path.Match(pattern, name); ok {
			matched[name] = content
		}
	}
	return matched
}

func (f files) AsConfig() string {
	m := map[string]string{}
	for name, content := range f {
		m[path.Base(name)] = string(content)
	}
	return toYAML(m)
}

func toYAML(v interface{}) string {
	data, err := yaml.Marshal(v)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(data), "\n")
}

func fromYAML(s string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := yaml.Unmarshal([]byte(s), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func toJSON(v interface{}) string {
	data, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(data)
}

func fromJSON(s string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

// required is Helm's: an error when the value is missing or an empty string.
func required(message string, value interface{}) (interface{}, error) {
	if value == nil {
		return nil, fmt.Errorf("%s", message)
	}
	if s, ok := value.(string); ok && s == "" {
		return nil, fmt.Errorf("%s", message)
	}
	return value, nil
}

// coalesce merges defaults under values as Helm does: maps merge recursively, the user's
// value wins otherwise, and a user's null removes the default.
func coalesce(values, defaults map[string]interface{}) map[string]interface{} {
	for key, def := range defaults {
		user, present := values[key]
		if !present {
			values[key] = def
			continue
		}
		if user == nil {
			delete(values, key)
			continue
		}
		um, uok := user.(map[string]interface{})
		dm, dok := def.(map[string]interface{})
		if uok && dok {
			values[key] = coalesce(um, dm)
		}
	}
	return values
}

// setPath sets a dotted key ("a.b.c", with "\." for a literal dot) in values.
func setPath(values map[string]interface{}, key string, value interface{}) {
	var parts []string
	var current strings.Builder
	for i := 0; i < len(key); i++ {
		switch {
		case key[i] == '\\' && i+1 < len(key) && key[i+1] == '.':
			current.WriteByte('.')
			i++
		case key[i] == '.':
			parts = append(parts, current.String())
			current.Reset()
		default:
			current.WriteByte(key[i])
		}
	}
	parts = append(parts, current.String())
	m := values
	for _, p := range parts[:len(parts)-1] {
		next, ok := m[p].(map[string]interface{})
		if !ok {
			next = map[string]interface{}{}
			m[p] = next
		}
		m = next
	}
	m[parts[len(parts)-1]] = value
}

// parseSetValue reads a --set value as Helm's strvals does for scalars.
func parseSetValue(s string) interface{} {
	switch s {
	case "true":
		return true
	case "false":
		return false
	case "null":
		return nil
	}
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		return i
	}
	return s
}

func readYAMLFile(name string) (map[string]interface{}, error) {
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	m := map[string]interface{}{}
	if err := yaml.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%s: %v", name, err)
	}
	return m, nil
}

type options struct {
	chartDir, releaseName, namespace string
	valueFiles                       []string
	sets, setFiles                   []string
}

func parseArgs(args []string) (options, error) {
	o := options{releaseName: "release-name", namespace: "default"}
	for i := 0; i < len(args); i++ {
		flagValue := func() (string, error) {
			if i+1 >= len(args) {
				return "", fmt.Errorf("%s needs a value", args[i])
			}
			i++
			return args[i], nil
		}
		var err error
		var v string
		switch args[i] {
		case "--release":
			v, err = flagValue()
			o.releaseName = v
		case "--namespace":
			v, err = flagValue()
			o.namespace = v
		case "-f", "--values":
			v, err = flagValue()
			o.valueFiles = append(o.valueFiles, v)
		case "--set":
			v, err = flagValue()
			o.sets = append(o.sets, v)
		case "--set-file":
			v, err = flagValue()
			o.setFiles = append(o.setFiles, v)
		default:
			if strings.HasPrefix(args[i], "-") || o.chartDir != "" {
				return o, fmt.Errorf("unexpected argument %q", args[i])
			}
			o.chartDir = args[i]
		}
		if err != nil {
			return o, err
		}
	}
	if o.chartDir == "" {
		return o, fmt.Errorf("usage: helm-render [--release NAME] [--namespace NS] [-f VALUES]... [--set K=V]... [--set-file K=PATH]... CHART_DIR")
	}
	return o, nil
}

func loadValues(o options) (map[string]interface{}, error) {
	values := map[string]interface{}{}
	for _, name := range o.valueFiles {
		m, err := readYAMLFile(name)
		if err != nil {
			return nil, err
		}
		values = coalesce(m, values)
	}
	for _, s := range o.sets {
		key, value, ok := strings.Cut(s, "=")
		if !ok {
			return nil, fmt.Errorf("--set %q: expected KEY=VALUE", s)
		}
		setPath(values, key, parseSetValue(value))
	}
	for _, s := range o.setFiles {
		key, name, ok := strings.Cut(s, "=")
		if !ok {
			return nil, fmt.Errorf("--set-file %q: expected KEY=PATH", s)
		}
		data, err := os.ReadFile(name)
		if err != nil {
			return nil, err
		}
		setPath(values, key, string(data))
	}
	defaults, err := readYAMLFile(filepath.Join(o.chartDir, "values.yaml"))
	if err != nil {
		return nil, err
	}
	return coalesce(values, defaults), nil
}

// loadChart returns the chart's templates (by Helm's names, "<chart>/templates/x.yaml")
// and its other files (for .Files).
func loadChart(dir, chartName string) (map[string]string, files, error) {
	templates := map[string]string{}
	other := files{}
	err := filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		switch {
		case strings.HasPrefix(rel, "templates/"):
			templates[chartName+"/"+rel] = string(data)
		case rel == "Chart.yaml" || rel == "values.yaml" || rel == ".helmignore" ||
			strings.HasPrefix(rel, "charts/"):
		default:
			other[rel] = data
		}
		return nil
	})
	return templates, other, err
}

func render(o options) (string, error) {
	var chart chartMetadata
	chartYAML, err := os.ReadFile(filepath.Join(o.chartDir, "Chart.yaml"))
	if err != nil {
		return "", err
	}
	if err := yaml.Unmarshal(chartYAML, &chart); err != nil {
		return "", fmt.Errorf("Chart.yaml: %v", err)
	}
	values, err := loadValues(o)
	if err != nil {
		return "", err
	}
	sources, chartFiles, err := loadChart(o.chartDir, chart.Name)
	if err != nil {
		return "", err
	}

	root := template.New("gotpl").Option("missingkey=zero")
	funcs := sprig.TxtFuncMap()
	// Helm removes these two: a chart must not read the renderer's environment.
	delete(funcs, "env")
	delete(funcs, "expandenv")
	funcs["toYaml"] = toYAML
	funcs["fromYaml"] = fromYAML
	funcs["toJson"] = toJSON
	funcs["fromJson"] = fromJSON
	funcs["required"] = required
	funcs["lookup"] = func(string, string, string, string) (map[string]interface{}, error) {
		return map[string]interface{}{}, nil
	}
	funcs["include"] = func(name string, data interface{}) (string, error) {
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, name, data); err != nil {
			return "", err
		}
		return buf.String(), nil
	}
	funcs["tpl"] = func(text string, data interface{}) (string, error) {
		t, err := root.Clone()
		if err != nil {
			return "", err
		}
		if _, err := t.New("tpl").Parse(text); err != nil {
			return "", err
		}
		var buf bytes.Buffer
		if err := t.ExecuteTemplate(&buf, "tpl", data); err != nil {
			return "", err
		}
		return buf.String(), nil
	}
	root.Funcs(funcs)

	names := make([]string, 0, len(sources))
	for name := range sources {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if _, err := root.New(name).Parse(sources[name]); err != nil {
			return "", err
		}
	}

	top := map[string]interface{}{
		"Values": values,
		"Chart":  chart,
		"Release": release{Name: o.releaseName, Namespace: o.namespace, Service: "Helm",
			Revision: 1, IsInstall: true},
		"Capabilities": capabilities{
			KubeVersion: kubeVersion{Version: "v1.31.0", Major: "1", Minor: "31"},
			APIVersions: versionSet{"v1", "batch/v1", "apps/v1"}},
		"Files": chartFiles,
	}
	var out strings.Builder
	for _, name := range names {
		if strings.HasPrefix(path.Base(name), "_") {
			continue // partials only define templates
		}
		data := map[string]interface{}{}
		for k, v := range top {
			data[k] = v
		}
		data["Template"] = map[string]interface{}{"Name": name, "BasePath": chart.Name + "/templates"}
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, name, data); err != nil {
			return "", err
		}
		text := strings.ReplaceAll(buf.String(), "<no value>", "")
		if strings.TrimSpace(text) == "" || path.Base(name) == "NOTES.txt" {
			continue // Helm prints NOTES.txt after an install, not as a manifest
		}
		fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", name, strings.TrimRight(text, "\n"))
	}
	return out.String(), nil
}

func main() {
	o, err := parseArgs(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "helm-render:", err)
		os.Exit(2)
	}
	manifests, err := render(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "helm-render:", err)
		os.Exit(1)
	}
	fmt.Print(manifests)
}
